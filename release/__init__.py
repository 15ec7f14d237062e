"""The release: `make release VERSION=x.y.z` runs release/build.py (docs/plugin-release.md)."""
