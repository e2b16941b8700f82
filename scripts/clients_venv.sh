#!/usr/bin/env bash
# A Python venv with the real embedding clients that `recall serve` must
# serve unchanged (openai, ollama, LangChain's OpenAIEmbeddings and
# OllamaEmbeddings), used by tests/it/serve.rs. Prints the venv's python on its
# last line.
set -euo pipefail
cache="${RECALL_TEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/recall-test}"
venv="$cache/clients-venv"
pins=(openai==3.57.0 ollama==0.6.3 langchain-openai==1.8.1 langchain-ollama==1.1.0)
if ! "$venv/bin/python" -c 'import openai, ollama, langchain_openai, langchain_ollama' >/dev/null 2>&1; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${pins[@]}" >&2
fi
echo "$venv/bin/python"
