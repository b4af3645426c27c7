#!/bin/sh
# Writes the inputs of check_to_dcp.py with this build's CLI:
#   tests/gen/make_to_dcp.sh SAFECKPT WORK
# For every tests/data/dcp-2.11 case: `safeckpt convert CASE/dcp --to-dcp WORK/CASE/dcp`
# (PyTorch's sharded directory, consolidated, written back with world size 1) beside the
# case's references (full.safetensors, expected.json); for a few tests/data/corpus/torch-2.11
# files: `safeckpt convert FILE --to-dcp WORK/NAME/dcp` beside the file (source.pt).
set -eu
cli=$1
work=$2
here=$(cd "$(dirname "$0")/../data" && pwd)
mkdir -p "$work"
for d in "$here"/dcp-2.11/*/; do
  name=$(basename "$d")
  mkdir -p "$work/$name"
  cp "$d/full.safetensors" "$d/expected.json" "$work/$name/"
  "$cli" convert "$d/dcp" --to-dcp "$work/$name/dcp"
done
for f in mlp_state_dict training_checkpoint views_shared_storage scalars_and_empty all_dtypes; do
  mkdir -p "$work/corpus-$f"
  cp "$here/corpus/torch-2.11/$f.pt" "$work/corpus-$f/source.pt"
  "$cli" convert "$work/corpus-$f/source.pt" --to-dcp "$work/corpus-$f/dcp" || rm -rf "$work/corpus-$f"
done
