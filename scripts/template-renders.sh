#!/usr/bin/env bash
# Remakes tests/data/template-renders/ (the renders tests/chat_templates.rs
# expects) with Hugging Face transformers, in a virtual environment of the
# pinned versions under target/template-venv (made on first use, from the
# Python package index).
#
# usage: scripts/template-renders.sh [--templates DIR --out DIR --bmoe BIN]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/template-venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check transformers==5.25.0 jinja2==3.1.6
fi
TRANSFORMERS_VERBOSITY=error "$venv/bin/python" scripts/template-renders.py "$@" 2> >(grep -v "PyTorch was not found" >&2)
