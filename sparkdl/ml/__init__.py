"""The Spark ML face's machinery: Params, persistence, scoring and evaluation jobs."""
