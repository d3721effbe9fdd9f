"""The confiner, lnk-sandbox: C sources and their build (build.py); the binary is built here."""
