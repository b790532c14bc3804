"""The parameter service: wire codec, merge rules, weight store, Flask app, client."""
