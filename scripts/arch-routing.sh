#!/usr/bin/env bash
# Routing realism of every generated architecture: a demo-sized synthetic model
# of each (8 layers, 64 experts, top-8, q8_0 experts) decodes 128 tokens with
# every expert cached (the trace is pure routing), and `bmoe trace-stats`
# prints its routing curve next to the real models' route traces.
#
# usage: scripts/arch-routing.sh [WORKDIR] [REAL_TRACE_DIR]
#   WORKDIR          where the models and traces go (default: arch-routing/)
#   REAL_TRACE_DIR   reference route traces (default: assets/route-traces)
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-arch-routing}
real=${2:-assets/route-traces}
mkdir -p "$work"
cargo build --release --quiet
bmoe=target/release/bmoe
prompt="The history of the city begins in the early medieval period, when a small settlement grew around the river crossing and its market."
archs=$($bmoe archs | awk '$2 == "yes" { print $1 }')
traces=()
for arch in $archs; do
  model="$work/$arch.gguf"
  [ -f "$model" ] || $bmoe make-model --preset demo --arch "$arch" -o "$model" 2> /dev/null
  $bmoe generate -m "$model" -p "$prompt" -n 129 --moe-stream --cache-mb 100000 \
    --route-trace "$work/$arch.trace" > /dev/null 2>&1
  traces+=("$work/$arch.trace")
done
$bmoe trace-stats --tokens 128 "${traces[@]}" "$real"/*.csv
