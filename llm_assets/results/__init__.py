"""What comes back: `rows` turns provider results into ledger rows, `validation` parses an
answer against the spec's output schema, and `quality` is the pandera quality gate over a
day's outputs."""
