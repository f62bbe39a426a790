"""The `llm-assets` command line: `main` parses and dispatches, `operator`, `evaluate` and
`promote` hold the operator's, evaluation and promotion commands, `args` the shared argument
parsing, and `console` every table and line the commands print."""
