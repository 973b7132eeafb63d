#!/usr/bin/env bash
# vLLM's own benchmark client (`vllm bench serve`) in a venv of its own (default .vllm-client/, ignored
# by git). Unlike SGLang's client it cannot be taken out of its wheel: `vllm bench serve` imports torch,
# torchvision and triton, and torch will not import without its CUDA libraries, so this is the whole
# vllm wheel with its dependencies (about 11 GB, 4-5 minutes from PyPI). On a box without a GPU the
# client still runs (vLLM switches `vllm bench` to its CPU platform); `vllm --version` does not.
# Idempotent: a complete install (stamp file) is left as it is.
set -euo pipefail
version="${VLLM_CLIENT_VERSION:-0.11.2}"
dir="${1:-.vllm-client}"
python="${PYTHON:-python3}"
if ! [[ "$version" =~ ^[0-9]+(\.[0-9]+)*$ ]]; then
  echo "install_vllm_client: VLLM_CLIENT_VERSION=$version (rule: digits and dots)" >&2; exit 2
fi
stamp="$dir/installed-$version"
[ -f "$stamp" ] && exit 0
rm -rf -- "$dir"
"$python" -m venv "$dir/venv"
# pip's own log goes to a file (hundreds of lines of index notices on some machines); its tail is
# printed when the install fails
if ! "$dir/venv/bin/pip" install -q --no-cache-dir "vllm==$version" > "$dir/install.log" 2>&1; then
  tail -n 40 "$dir/install.log" >&2
  echo "install_vllm_client: pip install vllm==$version failed (log: $dir/install.log)" >&2
  exit 1
fi
touch "$stamp"
