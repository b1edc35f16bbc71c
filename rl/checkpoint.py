"""Checkpoints that survive damage: the last N units and the best by validation pass@1, and exact resume.

A checkpoint is a directory `<directory>/last/<step>/` written by orbax with two items:
  state  a pytree of arrays: the train state (params, optimizer, KL controller, step, rng),
         the frozen reference params of an RL stage, the curriculum arrays; a LoRA run (model.lora) holds
         only the adapters and their optimizer state (no base, no reference copy: both are the base weights the
         run loads from its config), with the lora section in the stage meta
  meta   JSON: stage index, unit index inside the stage, global unit counter, eval history,
         the summary so far, anything else the trainer needs to carry on exactly
plus `checksums.json`: the SHA-256 and size of every file orbax wrote, and a hash of that list itself.

    ck = Checkpointer(workdir + "/checkpoints", keep=2, keep_best=True)
    ck.save(step, tree, meta, val_pass1=0.4)         # also offered to the best copy
    step = ck.latest_step()                           # newest INTACT step; None on a fresh workdir
    meta = ck.restore_meta(step)                      # read first: it says which stage's tree to build
    tree = ck.restore(step, template_tree)            # arrays restored into the template's structure
    step, meta, tree = ck.restore_latest(template_fn) # the three above in one call (template_fn(meta) -> tree)

Layout: a checkpoint written before the blocks were stored stacked holds per-layer "block_i" trees; a Checkpointer
given the model's layer plan (`layers=layer_stack.layer_groups(model_cfg)`) restores it into the per-layer view of
the template and converts the result (models/layer_stack.py to_stacked), so old run directories resume exactly.

Damage: every restore first checks each file against checksums.json. A step directory without checksums (a
kill between orbax's rename and the checksums; hashing a large model takes seconds) is not yet written: latest_step()
passes over it with one line, so the run resumes from the previous state, or starts afresh when it was the first.
latest_step() skips damaged checkpoints (truncated, flipped bytes, zeroed, missing or empty files, a garbled
manifest), printing one line per damaged step that names its damaged files, and returns the newest intact
one; when written checkpoints exist but none is intact it raises CheckpointError naming the damaged files. No
restore ever loads unverified bytes, and every failure is a CheckpointError, never an orbax traceback.

Reading a run's policies from outside the run (best / last / a global unit, one numbering of units) is
rl/runs.py (find_policy, load_policy).

Writing: orbax writes into a temporary directory and renames it when complete; the checksums are written
next (temporary file, fsync, rename); only then are checkpoints beyond `keep` deleted, so a kill at any
moment leaves the previous intact checkpoint in place. Temporary directories left by a kill are removed
when a Checkpointer opens the directory. Saving is synchronous (the trainer saves between units).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp

from models import layer_stack

__all__ = ["Checkpointer", "CheckpointError", "verify_checkpoint", "step_dirs", "written_steps"]

MANIFEST = "checksums.json"
_FORMAT = 1
_TMP_MARKERS = (".orbax-checkpoint-tmp", ".tmp-")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used; the message names the directory and the damaged files."""


def _to_numpy(tree):
    """Device arrays -> host NumPy (PRNG key arrays as their raw uint32 data)."""

    def conv(x):
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.asarray(x)

    return jax.tree.map(conv, tree)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(root: str) -> list[str]:
    """Every regular file under root, as sorted relative paths (the manifest itself excluded)."""
    out = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if rel != MANIFEST:
                out.append(rel)
    return sorted(out)


def _files_digest(files: dict) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove(path: str) -> None:
    """Remove what is at `path` (a directory tree, a file or a link), if anything."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def _write_manifest(path: str, extra: dict) -> None:
    files = {rel: {"size": os.path.getsize(os.path.join(path, rel)), "sha256": _sha256(os.path.join(path, rel))}
             for rel in _files(path)}
    body = {"format": _FORMAT, "files": files, "files_sha256": _files_digest(files), **extra}
    tmp = os.path.join(path, MANIFEST + ".tmp-" + str(os.getpid()))
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(body, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(path, MANIFEST))
    _fsync_dir(path)


def _read_manifest(path: str) -> tuple[dict | None, str]:
    """(manifest, "") or (None, why it is unusable)."""
    mpath = os.path.join(path, MANIFEST)
    if not os.path.exists(mpath):
        return None, f"{MANIFEST}: missing (written before checksums, or killed before they were written)"
    try:
        with open(mpath, "rb") as f:
            body = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError) as e:
        return None, f"{MANIFEST}: unreadable ({type(e).__name__})"
    files = body.get("files") if isinstance(body, dict) else None
    if (not isinstance(files, dict) or body.get("format") != _FORMAT
            or body.get("files_sha256") != _files_digest(files)
            or not all(isinstance(v, dict) and isinstance(v.get("size"), int) and isinstance(v.get("sha256"), str)
                       for v in files.values())):
        return None, f"{MANIFEST}: damaged (its own checksum does not match)"
    return body, ""


def verify_checkpoint(path: str) -> list[str]:
    """The damaged files of the checkpoint directory `path` ("file: why"), or [] when every file matches."""
    if not os.path.isdir(path):
        return [f"{path}: missing"]
    manifest, why = _read_manifest(path)
    if manifest is None:
        return [why]
    damaged = []
    for rel, want in sorted(manifest["files"].items()):
        full = os.path.join(path, rel)
        try:
            size = os.path.getsize(full)
        except OSError:
            damaged.append(f"{rel}: missing")
            continue
        if size != want["size"]:
            damaged.append(f"{rel}: {size} bytes, expected {want['size']} (truncated or overwritten)")
        elif _sha256(full) != want["sha256"]:
            damaged.append(f"{rel}: checksum mismatch")
    if not manifest["files"]:
        damaged.append(f"{MANIFEST}: lists no files")
    return damaged


def step_dirs(root: str) -> list[int]:
    """The steps under `root` (a `last` directory) that have a directory, written or not, sorted."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit() and os.path.isdir(os.path.join(root, n)))


def written_steps(root: str) -> list[int]:
    """The steps under `root` (a `last` directory) whose writing completed, i.e. that have checksums, intact or
    not; a step directory without them was interrupted before its checksums and is not yet written."""
    return [s for s in step_dirs(root) if os.path.isfile(os.path.join(root, str(s), MANIFEST))]


class Checkpointer:
    """The `last` checkpoints (keep N most recent) and a `best` copy (max validation pass@1), verified on read."""

    def __init__(self, directory: str, keep: int = 2, keep_best: bool = True, layers=None):
        """layers: the model's layer plan (layer_stack.layer_groups), so checkpoints of the per-layer layout
        convert on read; None restores only what matches the template."""
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise ValueError(f"Checkpointer.keep must be an int >= 1, got {keep!r}")
        self.directory = os.path.abspath(directory)
        self.keep, self.keep_best = keep, bool(keep_best)
        self._last = os.path.join(self.directory, "last")
        self._best = os.path.join(self.directory, "best")
        self._primary = jax.process_index() == 0
        if self._primary:
            for d in (self._last, self._best) if keep_best else (self._last,):
                os.makedirs(d, exist_ok=True)
            self.removed_tmp = self._remove_tmp()
        else:
            self.removed_tmp = []
        self._ckptr = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
        self.layers = None if layers is None else tuple(layers)
        self._verified: dict[str, tuple] = {}  # path -> (file signature, damaged list)
        self._reported: set[str] = set()
        self.damaged: dict[int, list[str]] = {}  # step of `last` -> its damaged files, as found

    # -------------------------------------------------------------------------------------- layout
    def _path(self, step: int, best: bool = False) -> str:
        return os.path.join(self._best if best else self._last, str(int(step)))

    def _remove_tmp(self) -> list[str]:
        """Temporary directories and files left by a kill during a write."""
        removed = []
        for root in (self._last, self._best):
            try:
                names = os.listdir(root)
            except OSError:
                continue
            for name in names:
                if any(m in name for m in _TMP_MARKERS):
                    full = os.path.join(root, name)
                    shutil.rmtree(full, ignore_errors=True) if os.path.isdir(full) else os.remove(full)
                    removed.append(full)
            for step in step_dirs(root):
                for name in os.listdir(os.path.join(root, str(step))):
                    if name.startswith(MANIFEST + ".tmp-"):
                        os.remove(os.path.join(root, str(step), name))
                        removed.append(os.path.join(root, str(step), name))
        if removed:
            print(f"checkpoint: removed {len(removed)} temporary file(s) left by an interrupted write in "
                  f"{self.directory}", file=sys.stderr, flush=True)
        return removed

    # -------------------------------------------------------------------------------------- checks
    def _damage(self, path: str) -> list[str]:
        """verify_checkpoint, cached while the files' sizes and times stay the same."""
        try:
            sig = tuple((rel, os.stat(os.path.join(path, rel)).st_size, os.stat(os.path.join(path, rel)).st_mtime_ns)
                        for rel in _files(path) + [MANIFEST] if os.path.exists(os.path.join(path, rel)))
        except OSError:
            sig = None
        cached = self._verified.get(path)
        if sig is not None and cached is not None and cached[0] == sig:
            return cached[1]
        damaged = verify_checkpoint(path)
        self._verified[path] = (sig, damaged)
        return damaged

    def _report(self, path: str, damaged: list[str], fallback: str) -> None:
        if path in self._reported:
            return
        self._reported.add(path)
        shown = "; ".join(damaged[:6]) + (f"; and {len(damaged) - 6} more" if len(damaged) > 6 else "")
        print(f"checkpoint: {path} is damaged ({shown}); {fallback}", file=sys.stderr, flush=True)

    def _require_intact(self, path: str) -> None:
        damaged = self._damage(path)
        if damaged:
            raise CheckpointError(f"checkpoint {path} is damaged: " + "; ".join(damaged))

    def latest_step(self) -> int | None:
        """The newest intact step of `last`; None when there is no written checkpoint. A step without checksums
        was never completed (a kill between orbax's rename and the checksums): it is not yet written, so it is
        passed over (one line) and a later save of that step replaces it. Damaged newer steps are reported (one
        line each, naming the files); CheckpointError when written checkpoints exist but none is intact."""
        steps = written_steps(self._last)
        for step in sorted(set(step_dirs(self._last)) - set(steps)):
            path = self._path(step)
            if path not in self._reported:
                self._reported.add(path)
                print(f"checkpoint: {path} was not completely written (killed before its checksums): passed over, "
                      f"not loaded", file=sys.stderr, flush=True)
        bad = []
        for step in reversed(steps):
            path = self._path(step)
            damaged = self._damage(path)
            if not damaged:
                for b in bad:
                    self._report(self._path(b), self.damaged[b], f"resuming from step {step} instead")
                return step
            self.damaged[step] = damaged
            bad.append(step)
        if not bad:
            return None
        lines = "\n  ".join(f"step {b}: " + "; ".join(self.damaged[b]) for b in bad)
        raise CheckpointError(f"no intact checkpoint in {self._last}; damaged:\n  {lines}\n"
                              f"(move the directory away to start the run afresh)")

    latest_intact_step = latest_step

    def best_step(self) -> int | None:
        """The step of the intact best copy, or None (a damaged copy is reported and ignored)."""
        if not self.keep_best:
            return None
        for step in reversed(step_dirs(self._best)):
            path = self._path(step, best=True)
            damaged = self._damage(path)
            if not damaged:
                return step
            self._report(path, damaged, "ignoring it")
        return None

    # -------------------------------------------------------------------------------------- restore
    def _restore(self, path: str, args) -> dict:
        self._require_intact(path)
        try:
            return self._ckptr.restore(path, args=args)
        except Exception as e:  # noqa: BLE001 - orbax raises many types; the caller gets one with the path
            first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
            raise CheckpointError(f"checkpoint {path} could not be restored: {type(e).__name__}: {first}") from None

    def restore_meta(self, step: int, best: bool = False) -> dict:
        meta = self._restore(self._path(step, best), ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        if not isinstance(meta, dict):
            raise CheckpointError(f"checkpoint {self._path(step, best)}: meta is {type(meta).__name__}, not an object")
        return meta

    def restore(self, step: int, template, best: bool = False) -> object:
        """Arrays of checkpoint `step` in the structure (and dtypes) of `template`, as host NumPy."""
        template = _to_numpy(template)
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), template)
        path = self._path(step, best)
        # compat: per_layer_checkpoint
        convert = self.layers is not None and saved_per_layer(path) and not layer_stack.is_per_layer(abstract)
        if convert:  # written before the stacked layout: restored per layer, then stacked
            abstract = layer_stack.to_per_layer(abstract, self.layers)
        out = self._restore(path, ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
        state = jax.tree.map(np.asarray, out["state"])
        return layer_stack.to_stacked(state, self.layers) if convert else state

    def restore_latest(self, template_fn):
        """(step, meta, tree) of the newest intact checkpoint, or None on a fresh directory.
        template_fn(meta) -> the tree template to restore into."""
        step = self.latest_step()
        if step is None:
            return None
        meta = self.restore_meta(step)
        return step, meta, self.restore(step, template_fn(meta))

    # -------------------------------------------------------------------------------------- save
    def save(self, step: int, tree, meta: dict, val_pass1: float | None = None) -> None:
        """Save `tree` + `meta` as `step`; with a validation pass@1, also offer it to the best copy."""
        tree = _to_numpy(tree)
        path = self._path(step)
        if self._primary:
            _remove(path)  # an older, damaged or unfinished checkpoint of the same step, or a stray file of its name
        args = ocp.args.Composite(state=ocp.args.StandardSave(tree), meta=ocp.args.JsonSave(meta))
        self._ckptr.save(path, args=args)
        if self._primary:
            _write_manifest(path, {"step": int(step), "val_pass@1": None if val_pass1 is None else float(val_pass1)})
            self._verified.pop(path, None)
            self._retire(self._last, keep=self.keep, newest=step)
            if self.keep_best and val_pass1 is not None:
                self._offer_best(step, path, float(val_pass1))
        self._sync("checkpoint_save")

    def _retire(self, root: str, keep: int, newest: int) -> None:
        """Delete checkpoints older than the `keep` newest that have checksums (never the one just written)."""
        complete = written_steps(root)
        keep_set = set(complete[-keep:]) | {newest}
        for s in step_dirs(root):
            if s not in keep_set and s < newest:
                shutil.rmtree(os.path.join(root, str(s)), ignore_errors=True)

    def _offer_best(self, step: int, path: str, val_pass1: float) -> None:
        current = self.best_step()
        if current is not None:
            manifest, _ = _read_manifest(self._path(current, best=True))
            prev = manifest.get("val_pass@1") if manifest else None
            if isinstance(prev, (int, float)) and val_pass1 <= prev:
                return
        dest = self._path(step, best=True)
        tmp = dest + ".tmp-" + str(os.getpid())
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(path, tmp)  # the copy carries the same checksums
        _remove(dest)
        os.replace(tmp, dest)
        _fsync_dir(self._best)
        self._retire(self._best, keep=1, newest=step)

    def _sync(self, name: str) -> None:
        if jax.process_count() > 1:
            ocp.multihost.sync_global_processes(name)

    def close(self) -> None:
        close = getattr(self._ckptr, "close", None)
        if close is not None:
            close()


def saved_per_layer(path: str) -> bool:
    """Whether the checkpoint directory `path` holds trees of the per-layer layout ("block_i" keys), from orbax's
    tree metadata (no array is read)."""
    handler = ocp.CompositeCheckpointHandler(state=ocp.StandardCheckpointHandler(), meta=ocp.JsonCheckpointHandler())
    try:
        tree = ocp.Checkpointer(handler).metadata(os.path.abspath(path)).item_metadata["state"]
    except Exception as e:  # noqa: BLE001 - orbax raises many types; the caller gets one with the path
        raise CheckpointError(f"checkpoint {path}: its tree metadata could not be read: {type(e).__name__}: {e}") \
            from None
    return layer_stack.is_per_layer(getattr(tree, "tree", tree))
