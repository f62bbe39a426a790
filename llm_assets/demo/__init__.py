"""`llm-assets demo`: `data` generates realistic support tickets (text from `corpus.yaml`
through `corpus`, personal data planted by `personal`), `run` drives the demo's days, and
`evaluate` compares the demo pipeline's variants."""
