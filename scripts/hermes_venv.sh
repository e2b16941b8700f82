#!/usr/bin/env bash
# A Python venv with the real Hermes Agent (hermes-agent==0.19.0 from PyPI,
# schema v22), used by the tests to write Hermes databases with Hermes's own
# SessionDB. Prints the venv's python on its last line.
set -euo pipefail
cache="${RECALL_TEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/recall-test}"
venv="$cache/hermes-venv"
if ! "$venv/bin/python" -c 'import hermes_state' >/dev/null 2>&1; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check hermes-agent==0.19.0 >&2
fi
echo "$venv/bin/python"
