"""What crosses from the driver to the tasks: the plan, payloads, reports, model bytes.

Imported by both sides; imports neither :mod:`sparkdl.driver` nor :mod:`sparkdl.executor`.
"""
