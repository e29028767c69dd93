#!/usr/bin/env bash
# Makes the Python virtual environment the server tests drive `bmoe serve`
# with: the official `openai`, `anthropic` and `ollama` packages (and selenium
# for the chat page), and
# `huggingface_hub`, which reads the hub cache `bmoe pull` writes (tests/hub.rs),
# from the Python package index. Idempotent; prints the venv's python.
#
# usage: scripts/client-venv.sh [DIR]   (default target/client-venv)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-target/client-venv}
stamp=$venv/.bmoe-ready-3
if [ ! -f "$stamp" ]; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check "openai>=1.66,<3" "anthropic>=0.40,<1" "ollama>=0.4,<1" "selenium>=4.20,<5" "huggingface_hub>=0.30,<3" >&2
  touch "$stamp"
fi
echo "$venv/bin/python"
