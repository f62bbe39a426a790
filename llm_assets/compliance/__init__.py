"""Personal data, residency and retention: what may leave for a provider, where it may go,
and how long what was sent and received is kept.

`spec` holds the spec's `compliance` and `retention` sections; `detect` finds personal data
and credentials in rendered prompts; `policy` applies a spec's actions to them.
"""
