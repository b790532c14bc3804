"""The driver side of a fit: orchestration, data scan, warm-up and the fit's followers."""
