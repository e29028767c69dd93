# Sourced by the bench scripts once they are in the repository root with
# `work` set: builds bmoe (release; BMOE=path uses that binary instead) and makes the model of preset $PRESET
# (default: bench; a full-size one such as qwen3-30b-a3b works too) in $work
# unless it is there; with `model_file` set (a script's MODEL argument), that
# file instead. Sets `bmoe` and `model`.
mkdir -p "$work"
if [ -n "${BMOE:-}" ]; then
  # Another binary, as given: nothing is built.
  bmoe=$BMOE
else
  cargo build --release --quiet
  bmoe=target/release/bmoe
fi
if [ -n "${model_file:-}" ]; then
  model=$model_file
else
  preset=${PRESET:-bench}
  model=$work/$preset.gguf
  [ -f "$model" ] || $bmoe make-model --preset "$preset" -o "$model"
fi
