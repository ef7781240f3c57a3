#!/usr/bin/env bash
# Creates the Python virtualenv the end-to-end client tests use (.venv at the repository root,
# git-ignored) and installs the official `openai` and `anthropic` SDKs and pytest from PyPI
# into it. Idempotent: an existing venv with all three is reused. Prints the venv's python path.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
PY=${PYTHON:-python3}
if ! [[ -x $VENV/bin/python ]]; then
  "$PY" -m venv "$VENV" >&2
fi
if ! "$VENV/bin/python" -c 'import openai, anthropic, pytest' 2>/dev/null; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    -r tests/python/requirements.txt >&2
fi
echo "$PWD/$VENV/bin/python"
