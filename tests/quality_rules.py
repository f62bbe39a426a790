"""A spec's own pandera rules, for tests: `output.pandera_model: tests.quality_rules:...`."""

import pandera.pandas as pa
from pandera.typing import Series


class NoRoutersInSummaries(pa.DataFrameModel):
    """A rule YAML cannot express: summaries must not mention routers (say, an embargo)."""

    summary: Series[str] = pa.Field()

    @pa.check("summary", name="no_router")
    def no_router(cls, summary: Series[str]) -> Series[bool]:  # noqa: N805
        return ~summary.str.contains("router")


class TerseSummaries(pa.DataFrameModel):
    """Summaries of at most five characters: every real summary fails it (a quality gate that
    blocks a whole day)."""

    summary: Series[str] = pa.Field(str_length={"max_value": 5})
