# Sourced by the bench scripts once they are in the repository root with
# `work` set: builds bmoe (release) and makes the bench preset model in
# $work unless it is there. Sets `bmoe` and `model`.
mkdir -p "$work"
cargo build --release --quiet
bmoe=target/release/bmoe
model=$work/bench.gguf
[ -f "$model" ] || $bmoe make-model --preset bench -o "$model"
