"""The errors of a labeling run, which its settings, its records, its loop and the run itself raise alike."""

from __future__ import annotations

from core.errors import UserError


class LabelingError(UserError):
    """A labeling run that cannot go on: its settings, its output folder or its prompts."""


class LabelingInterrupted(LabelingError):
    """The run stopped (Ctrl-C, or a DDP rank whose launcher is gone) before every batch was written; the same
    command resumes it."""
