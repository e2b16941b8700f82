"""Where a model comes from, by the `recall` command's rules (its
src/model/locate.rs): a directory; else a hub repository (`BAAI/bge-m3`) or
a short name recall knows (`bge-m3`, `all-MiniLM-L6-v2`) in the Hugging
Face cache; with no name, `RECALL_MODEL`, then BAAI/bge-m3 in that cache.
Nothing here touches the network: a model missing from the cache is an
error that says how to fetch it.
"""

import os
from pathlib import Path
from typing import Optional, Union

DEFAULT_REPO = "BAAI/bge-m3"
# The BAAI/bge-m3 revision recall is tested against.
DEFAULT_REVISION = "5617a9f61b028005a4858fdac845db406aefb181"
# The models `recall model fetch NAME` knows, by short name.
KNOWN = {
    "bge-m3": DEFAULT_REPO,
    "all-minilm-l6-v2": "sentence-transformers/all-MiniLM-L6-v2",
}


def hub_cache_dir() -> Path:
    """`$HF_HUB_CACHE`, `$HF_HOME/hub`, or `~/.cache/huggingface/hub`."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def hub_snapshot(cache: Path, repo: str) -> Optional[Path]:
    """The snapshot of `repo` in `cache` that `refs/main` names, else the
    pinned default revision, else the only one there."""
    root = cache / ("models--" + repo.replace("/", "--"))
    snapshots = root / "snapshots"
    if not snapshots.is_dir():
        return None

    def usable(revision: str) -> Optional[Path]:
        path = snapshots / revision
        return path if (path / "config.json").exists() else None

    main = root / "refs" / "main"
    if main.is_file():
        found = usable(main.read_text().strip())
        if found:
            return found
    found = usable(DEFAULT_REVISION)
    if found:
        return found
    revisions = sorted(p.name for p in snapshots.iterdir() if usable(p.name))
    if len(revisions) > 1:
        raise ValueError(
            f"{snapshots} holds several snapshots ({', '.join(revisions)}) and no refs/main: "
            "pass the directory of the one to use"
        )
    return usable(revisions[0]) if revisions else None


def locate(name_or_path: Union[str, "os.PathLike[str]", None] = None) -> str:
    """The model directory `name_or_path` names (see the module's rules)."""
    if name_or_path is None:
        env = os.environ.get("RECALL_MODEL")
        if env:
            return _checked(env, "RECALL_MODEL")
        cache = hub_cache_dir()
        found = hub_snapshot(cache, DEFAULT_REPO)
        if found:
            return str(found)
        raise FileNotFoundError(
            f"no model found: pass a model directory or set RECALL_MODEL, or put {DEFAULT_REPO} "
            f"in the Hugging Face cache (looked in {cache}), e.g. `recall model fetch bge-m3` "
            f"or `huggingface-cli download {DEFAULT_REPO} --revision {DEFAULT_REVISION}`"
        )
    return _checked(os.fspath(name_or_path), "model")


def _checked(name: str, what: str) -> str:
    if os.path.isdir(name):
        return name
    repo = KNOWN.get(name.lower()) or (name if name.count("/") == 1 and not os.path.exists(name) else None)
    if repo is None:
        raise FileNotFoundError(f"{what} {name}: no such directory")
    cache = hub_cache_dir()
    found = hub_snapshot(cache, repo)
    if found:
        return str(found)
    short = repo.rsplit("/", 1)[-1]
    fetch = f"`recall model fetch {short}`" if short.lower() in KNOWN else f"`huggingface-cli download {repo}`"
    raise FileNotFoundError(
        f"{what} {name}: no such directory, nor is {repo} in the Hugging Face cache ({cache}): "
        f"{fetch} downloads it"
    )
