"""Asset checks: names are constants; ERROR checks gate, WARN checks advise."""

from collections.abc import Sequence

import dagster as dg

from llm_assets.resources.ledger import JobCounts

NO_MISSING_RESULTS = "no_missing_results"
NO_DUPLICATE_RESULTS = "no_duplicate_results"


def id_table(custom_ids: Sequence[str], limit: int = 20) -> str:
    rows = "\n".join(f"| {cid} |" for cid in custom_ids[:limit])
    more = f"\n\n… and {len(custom_ids) - limit} more" if len(custom_ids) > limit else ""
    return f"| custom_id |\n|---|\n{rows}{more}"


def batch_results_check_specs(key: dg.AssetKey) -> list[dg.AssetCheckSpec]:
    return [
        dg.AssetCheckSpec(
            NO_MISSING_RESULTS,
            asset=key,
            description="Once the job is terminal, every item that was sent has a result.",
        ),
        dg.AssetCheckSpec(
            NO_DUPLICATE_RESULTS,
            asset=key,
            description="The provider sent no custom_id twice in this import.",
        ),
    ]


def missing_results_check(missing: Sequence[str], counts: JobCounts) -> dg.AssetCheckResult:
    terminal = counts.total > 0 and counts.open == 0
    return dg.AssetCheckResult(
        check_name=NO_MISSING_RESULTS,
        passed=not missing,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "job_terminal": terminal,
            "missing_results": len(missing),
            "open_items": counts.open,
            "custom_ids": dg.MetadataValue.md(id_table(missing)) if missing else "",
        },
        description=None if not missing else f"{len(missing)} items were sent and never answered",
    )


def duplicate_results_check(duplicates: int, custom_ids: Sequence[str]) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        check_name=NO_DUPLICATE_RESULTS,
        passed=duplicates == 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "duplicate_lines": duplicates,
            "custom_ids": dg.MetadataValue.md(id_table(custom_ids)) if custom_ids else "",
        },
    )
