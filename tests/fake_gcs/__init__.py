"""A fake Cloud Storage JSON API (server.py) that the real google-cloud-storage client talks to."""
