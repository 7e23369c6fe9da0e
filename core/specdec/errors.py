"""Errors users see. The CLI prints any `SpecdecError` as one line and exits with code 2."""

from __future__ import annotations


class SpecdecError(Exception):
    """Base class for errors caused by user input or the environment, not by a bug."""


class ConfigError(SpecdecError, ValueError):
    """A speculative or sampling configuration is invalid; the message names the field."""


class UnknownMethodError(ConfigError):
    """The requested speculation method is not installed; the message lists the installed ones."""


class PluginError(SpecdecError):
    """A plugin the user selected failed to load or misbehaved; the message carries the cause."""


class ModelLoadError(SpecdecError):
    """A model or tokenizer could not be loaded."""


class VerifyInputError(SpecdecError, ValueError):
    """Tensors passed to ``specdec.kernels`` have a wrong shape, dtype, device or content; the
    message names the argument."""


class NonFiniteLogitsError(SpecdecError):
    """The target model produced NaN or ``+inf`` logits for a request, which therefore ends."""

    def __init__(self) -> None:
        super().__init__("the target model produced NaN or +inf logits (a broken checkpoint, or an overflow in its dtype)")


class QueueFullError(SpecdecError):
    """The engine's waiting queue is full (``max_queue_size``): retry later."""


class RequestFailedError(PluginError):
    """Requests of a ``generate`` call ended with an error (most often a plugin hook that raised);
    the others finished. ``outputs`` holds every request's output, in prompt order."""

    def __init__(self, message: str, outputs: list) -> None:
        super().__init__(message)
        self.outputs = outputs
