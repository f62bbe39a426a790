"""The lengths of the ledger's bounded text columns that values from outside fill.

PostgreSQL refuses a value longer than its VARCHAR column (SQLite stores it anyway), so
what may be too long is stopped where it comes in: a spec's prompt version and model name
by spec validation, a provider's codes and statuses by cutting them to these lengths. The
tables are declared with these numbers; nothing is imported here, so a worker process that
makes ledger rows reads them without SQLAlchemy.
"""

PROMPT_VERSION = 64
MODEL_NAME = 128
ERROR_CODE = 128
FINISH_REASON = 64
RAW_STATUS = 64
