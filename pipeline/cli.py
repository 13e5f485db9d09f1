"""``specheads lightning fit|validate|test|predict --config configs/train/….yaml`` (LightningCLI)."""

from __future__ import annotations

import importlib.util
import sys
from argparse import ArgumentError
from pathlib import Path

from lightning_fabric.utilities.exceptions import MisconfigurationException
from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint
from pytorch_lightning.cli import LightningCLI
from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger

from core.arguments import one_line
from core.errors import UserError
import heads  # noqa: F401  (registers the head types, so short class names resolve)
from pipeline.data import LabelDataModule
from pipeline.module import HeadModule


BASE_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "train" / "base.yaml"
"""What every head's training shares: read before a head's own config (``HeadCLI``)."""


def default_loggers(root: str) -> list:
    """CSV always; TensorBoard too when it is installed."""
    loggers = [CSVLogger(root, name="csv")]
    if importlib.util.find_spec("tensorboard") is not None or importlib.util.find_spec("tensorboardX") is not None:
        loggers.append(TensorBoardLogger(root, name="tb"))
    return loggers


class HeadCLI(LightningCLI):
    """LightningCLI for heads: the head's input size is linked from the data; early stopping and checkpoints
    are configured under ``early_stopping`` and ``checkpoint``."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        if not BASE_CONFIG.is_file():
            raise UserError(f"{BASE_CONFIG} is missing: every head's config overrides it (run from the project's clone)")
        # the base config is the parser's defaults; with subcommands (fit, test, …) each has a parser of its own
        base = {"default_config_files": [str(BASE_CONFIG)]}
        subcommands = ("fit", "validate", "test", "predict")
        # a setting the parser refuses raises (``parse_arguments``: one line) where jsonargparse prints its usage
        given = {"exit_on_error": False, "prog": "specheads lightning",
                 "description": "One training config through LightningCLI: fit, validate, test or predict "
                                "(specheads lightning fit --config configs/train/<file>.yaml).",
                 **(kwargs.get("parser_kwargs") or {})}
        kwargs["parser_kwargs"] = ({**base, **given} if kwargs.get("run") is False
                                   else {**given, **{s: {**base, **given.get(s, {})} for s in subcommands}})
        super().__init__(HeadModule, LabelDataModule, *args, **kwargs)

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.hidden_size", "model.head.init_args.hidden_size", apply_on="instantiate")
        parser.link_arguments("data.extra_size", "model.head.init_args.extra_size", apply_on="instantiate")
        parser.add_lightning_class_args(EarlyStopping, "early_stopping")
        parser.set_defaults({"early_stopping.monitor": "val/loss", "early_stopping.patience": 5})
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({"checkpoint.monitor": "val/loss", "checkpoint.dirpath": "checkpoints/head",
                             "checkpoint.filename": "best", "checkpoint.save_last": False})

    def parse_arguments(self, parser, args) -> None:
        """The settings, or one ``SettingError`` naming the key that is mistyped, unknown or missing."""
        try:
            super().parse_arguments(parser, args)
        except ArgumentError as e:
            raise one_line(e, "`specheads lightning fit --help`") from None

    def _instantiate_trainer(self, config, callbacks):
        if config.get("logger") in (None, True):
            config["logger"] = default_loggers(config.get("default_root_dir") or "runs/train")
        return super()._instantiate_trainer(config, callbacks)


def main(args: list[str] | None = None, run: bool = True) -> HeadCLI:
    """The CLI; an error of the user's making (a setting, a label folder, a trainer setting Lightning refuses) ends it
    with one line and status 2."""
    try:
        return HeadCLI(args=args, run=run)
    except (UserError, MisconfigurationException) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
