"""From a source file to request lines: `source` and `source_lines` read a pipeline's rows,
`ids` makes every item's stable custom_id, `prepare` renders and checks each item's prompt,
`tokens` counts its tokens and `sharding` splits a day's request lines into shards."""
