"""The `llm-assets` command line: `main` parses and dispatches, `run`, `operator`, `evaluate`
and `promote` hold the run, operator's, evaluation and promotion commands, `args` the shared
argument parsing; `console` the two consoles, `tables` tables that fit them, `text` the words,
and `day_report`, `ledger_report` and `eval_report` what the commands print."""
