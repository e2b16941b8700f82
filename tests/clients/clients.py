"""Real client libraries against a running `recall serve`.

Usage: clients.py BASE_URL TEXTS_JSON
Prints one JSON object: each client's vectors for TEXTS (and errors it saw),
for tests/it/serve.rs to compare with `recall embed`.
"""
import base64
import json
import struct
import sys

import ollama
import openai
from langchain_ollama import OllamaEmbeddings
from langchain_openai import OpenAIEmbeddings

base, texts = sys.argv[1], json.loads(sys.argv[2])
out = {}

client = openai.OpenAI(base_url=base + "/v1", api_key="not-needed-on-loopback")
# The SDK's default: it asks for base64 and decodes it itself.
out["openai_default"] = [d.embedding for d in client.embeddings.create(model="bge-m3", input=texts).data]
out["openai_float"] = [
    d.embedding for d in client.embeddings.create(model="bge-m3", input=texts, encoding_format="float").data
]
raw = client.embeddings.create(model="BAAI/bge-m3", input=texts, encoding_format="base64")
out["openai_base64"] = [
    list(struct.unpack("<%df" % (len(base64.b64decode(d.embedding)) // 4), base64.b64decode(d.embedding)))
    for d in raw.data
]
out["openai_usage"] = raw.usage.prompt_tokens
try:
    client.embeddings.create(model="text-embedding-3-small", input=texts)
    out["openai_unknown_model"] = "no error"
except openai.NotFoundError as e:
    out["openai_unknown_model"] = {"status": e.status_code, "code": e.code, "message": e.message}
try:
    client.embeddings.create(model="bge-m3", input=texts, dimensions=7)
    out["openai_dimensions"] = "no error"
except openai.BadRequestError as e:
    out["openai_dimensions"] = {"status": e.status_code, "param": e.param, "message": e.message}

oc = ollama.Client(host=base)
out["ollama_embed"] = [list(v) for v in oc.embed(model="bge-m3", input=texts).embeddings]
out["ollama_embeddings"] = list(oc.embeddings(model="bge-m3", prompt=texts[0]).embedding)
out["ollama_tags"] = [m.model for m in oc.list().models]
try:
    oc.embed(model="llama3", input=texts)
    out["ollama_unknown_model"] = "no error"
except ollama.ResponseError as e:
    out["ollama_unknown_model"] = {"status": e.status_code, "message": e.error}

out["langchain_openai"] = OpenAIEmbeddings(
    model="bge-m3",
    base_url=base + "/v1",
    api_key="not-needed-on-loopback",
    # Otherwise it sends tiktoken ids (another vocabulary) and needs the network for tiktoken's files.
    check_embedding_ctx_length=False,
).embed_documents(texts)
out["langchain_ollama"] = OllamaEmbeddings(model="bge-m3", base_url=base).embed_documents(texts)

print(json.dumps(out))
