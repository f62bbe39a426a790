"""Pipeline specs: `model` is the YAML's pydantic model, `checks` the rules one field alone
cannot state, and `load` parses spec files and runs every check (the list is there)."""
