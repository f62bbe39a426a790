"""Small helpers with no knowledge of pipelines: JSON, worker processes, settings from the
environment, file locks, words for people, memory and progress, failpoints, secrets in
URLs."""
