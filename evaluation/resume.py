"""An eval folder's record of the settings its results were made with (``settings.json``): checked before an
evaluation resumes in the folder or ``--report_only`` rewrites its report, and written once every input is checked."""

from __future__ import annotations

import json
from pathlib import Path

from core.runfolder import read_json, write_json
from evaluation.config import EvalConfig, EvalError
from evaluation.results import ResultStore
from evaluation.rundir import RunDir


def check_output(cfg: EvalConfig, out: Path, inputs: dict) -> dict:
    """The settings to record in ``out`` (``commit_output``), touching nothing: with ``overwrite``, these; else,
    after checking that the results already in ``out`` were made with these settings, inputs and heads, these with
    the folder's other modes. Whose folder it is, ``RunFolder.check`` decides; results whose settings are unknown are
    refused. Called with the folder held."""
    folder = RunDir(out)
    folder.folder.check(beside=cfg.overwrite)
    settings = json.loads(json.dumps({**cfg.settings(), "inputs": inputs}))
    if cfg.overwrite or not folder.folder.ours():
        return settings
    path, results = folder.settings, folder.results
    if not path.exists():
        if results.exists() and len(ResultStore(results)):
            raise EvalError(f"{results} has no {path.name} beside it, so the settings its results were made with "
                            "are unknown; use another output_dir or overwrite: true")
    elif results.exists() and len(ResultStore(results)):  # settings without results bind nothing
        old = read_json(path, "use another output_dir or overwrite: true")
        if not isinstance(old, dict) or not isinstance(old.get("modes"), dict):
            raise EvalError(f"{path} is not an evaluation's settings; use another output_dir or overwrite: true")
        diff = settings_differences(old, settings)
        if diff:
            raise EvalError(f"{out} holds results of other settings ({', '.join(diff)}); "
                            f"use another output_dir or overwrite: true")
        settings["modes"] = {**old["modes"], **settings["modes"]}
    return settings


def settings_differences(old: dict, settings: dict) -> list[str]:
    """The settings (and, where ``settings`` has them, the inputs) in which an eval folder's recorded ``old``
    differs from ``settings``; modes only where both have them (a folder gathers modes run apart)."""
    diff = [k for k in settings if k not in ("modes", "inputs") and old.get(k) != settings[k]]
    diff += [f"modes.{m}" for m in sorted(set(old["modes"]) & set(settings["modes"]))
             if old["modes"][m] != settings["modes"][m]]
    if "inputs" in settings:
        recorded = old.get("inputs", {})
        diff += [f"inputs.{k} (content changed)" for k in sorted(set(recorded) | set(settings["inputs"]))
                 if recorded.get(k) != settings["inputs"].get(k)]
    return diff


def check_report_folder(cfg: EvalConfig) -> Path:
    """``--report_only``: the folder holds an evaluation's results and the settings they were made with, and these
    are the config's (the report states the config's settings); else one line. Returns the folder."""
    out = Path(cfg.output_dir)
    folder = RunDir(out)
    if not folder.results.is_file() or not folder.settings.is_file():
        missing = folder.results.name if not folder.results.is_file() else folder.settings.name
        raise EvalError(f"--report_only rewrites the report of an eval in {out}, and it holds none (no {missing}): "
                        "run the eval first")
    folder.folder.check()
    old = read_json(folder.settings, "run the eval again with overwrite: true")
    if not isinstance(old, dict) or not isinstance(old.get("modes"), dict):
        raise EvalError(f"{folder.settings} is not an evaluation's settings")
    diff = settings_differences(old, json.loads(json.dumps(cfg.settings())))
    if diff:
        raise EvalError(f"{out} holds results of other settings than the config's ({', '.join(diff)}): the report "
                        "would describe runs that were not made so; give the config the results were made with")
    return out


def commit_output(cfg: EvalConfig, out: Path, settings: dict) -> None:
    """Start over (deleting only ``RunDir.files``) when asked to, and record ``settings`` (``check_output``) in
    ``settings.json``: the first change to the folder, made once every input is checked."""
    folder = RunDir(out)
    if cfg.overwrite:
        folder.folder.clear()
    folder.folder.start()
    write_json(folder.claim(folder.settings), settings)
