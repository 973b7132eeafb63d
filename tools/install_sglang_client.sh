#!/usr/bin/env bash
# SGLang's own benchmark client (`python3 -m sglang.bench_serving`) without the engine: the sglang wheel
# unpacked --no-deps (no torch) plus the client's light dependencies, in a venv of its own
# (default .sglang-client/, ignored by git). The tests that run the real client against enginesim use it.
# Idempotent: a complete install (stamp file) is left as it is.
set -euo pipefail
version="${SGLANG_CLIENT_VERSION:-0.5.6}"
dir="${1:-.sglang-client}"
python="${PYTHON:-python3}"
if ! [[ "$version" =~ ^[0-9]+(\.[0-9]+)*$ ]]; then
  echo "install_sglang_client: SGLANG_CLIENT_VERSION=$version (rule: digits and dots)" >&2; exit 2
fi
stamp="$dir/installed-$version"
[ -f "$stamp" ] && exit 0
rm -rf -- "$dir"
"$python" -m venv "$dir/venv"
"$dir/venv/bin/pip" install -q aiohttp numpy pybase64 requests tqdm pillow transformers datasets
"$dir/venv/bin/pip" download -q "sglang==$version" --no-deps -d "$dir/wheel"
"$dir/venv/bin/python" -m zipfile -e "$dir/wheel/sglang-$version-py3-none-any.whl" "$dir/src"
# Only the client module and the package marker: sglang/__init__.py imports the engine's frontend.
pkg="$dir/venv/lib/$("$dir/venv/bin/python" -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')/site-packages/sglang"
mkdir -p "$pkg"
cp "$dir/src/sglang/bench_serving.py" "$dir/src/sglang/version.py" "$pkg/"
printf '"""The client part of the sglang %s wheel only (tools/install_sglang_client.sh)."""\nfrom sglang.version import __version__\n' "$version" > "$pkg/__init__.py"
mkdir -p "$pkg-$version.dist-info"
printf 'Metadata-Version: 2.1\nName: sglang\nVersion: %s\n' "$version" > "$pkg-$version.dist-info/METADATA"
rm -rf -- "$dir/src"
touch "$stamp"
