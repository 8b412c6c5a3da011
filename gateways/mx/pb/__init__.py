"""Code generated from proto/*.proto by proto/generate.sh: do not edit."""
