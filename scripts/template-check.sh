#!/usr/bin/env bash
# The wide template check: renders every chat template in DIR with Hugging
# Face transformers (thinking on and off, set the way bmoe sets each
# template's switches) and with bmoe, for the conversations of
# scripts/template-renders.py, and compares them byte for byte. Prints each
# case that differs; exits non-zero if any does. Work files go to
# target/template-check/.
#
# usage: scripts/template-check.sh DIR
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: scripts/template-check.sh DIR (a folder of .jinja chat templates)}
work=$PWD/target/template-check
rm -rf "$work"
mkdir -p "$work/templates"
shopt -s nullglob
templates=("$dir"/*.jinja)
[ ${#templates[@]} -gt 0 ] || { echo "template-check: no .jinja files in $dir" >&2; exit 2; }
cp -- "${templates[@]}" "$work/templates/"
echo "== building bmoe"
cargo build --release --quiet
echo "== rendering ${#templates[@]} templates with transformers"
scripts/template-renders.sh --templates "$work/templates" --out "$work/renders" --bmoe target/release/bmoe
echo "== comparing with bmoe"
BMOE_TEMPLATE_CHECK=$work cargo test --release --quiet --test chat_templates -- \
  --ignored --exact wide_template_check --nocapture
