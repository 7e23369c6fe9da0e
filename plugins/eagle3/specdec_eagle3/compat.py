"""Match a loaded head to the target: fused layers, hidden sizes, vocabulary."""

from __future__ import annotations

from specdec import ConfigError, ModelLoadError
from specdec_eagle3.head import Eagle3HeadConfig


def default_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's default: the hidden states entering layers 2, L//2 and L-3 (SafeAILab, vLLM)."""
    return (2, num_layers // 2, num_layers - 3)


def resolve_layers(requested: list[int] | None, head: Eagle3HeadConfig, num_layers: int) -> tuple[int, ...]:
    """The target layers to fuse, in ascending order: the option, else the checkpoint's, else the default."""
    field = "eagle3_layers_to_capture"
    if requested is not None:
        layers = tuple(sorted(requested))
    elif head.layers_to_capture is not None:
        layers = head.layers_to_capture
    else:
        layers = default_layers(num_layers)
        if len(set(layers)) != len(layers) or layers[-1] >= num_layers or layers[0] >= num_layers:
            raise ConfigError(
                f"{field}: the default layers {{2, L//2, L-3}} need a target with at least 7 decoder layers, "
                f"this one has {num_layers}; set {field}"
            )
    bad = [i for i in layers if not 0 <= i < num_layers]
    if bad:
        raise ConfigError(
            f"{field}: layer {bad[0]} does not exist in a target with {num_layers} decoder layers "
            f"(valid: 0-{num_layers - 1}; hidden_states[i] is the input of layer i)"
        )
    if len(layers) != head.num_fused_layers:
        raise ConfigError(
            f"{field}: {len(layers)} layers {list(layers)} but the head's fc fuses {head.num_fused_layers} "
            f"(fc.weight is [{head.hidden_size}, {head.num_fused_layers} x {head.target_hidden_size}])"
        )
    return layers


def check_target(head: Eagle3HeadConfig, has_embedding: bool, target_hidden: int, target_vocab: int, source: str) -> None:
    """A clear error when the head was built for a different target."""
    if head.target_hidden_size != target_hidden:
        raise ModelLoadError(
            f"EAGLE-3 head {source!r}: its fc reads target states of width {head.target_hidden_size}, "
            f"but the target's hidden_size is {target_hidden}"
        )
    if head.vocab_size != target_vocab:
        raise ModelLoadError(
            f"EAGLE-3 head {source!r}: vocab_size {head.vocab_size} differs from the target's {target_vocab} tokens"
        )
    if not has_embedding and head.hidden_size != target_hidden:
        raise ModelLoadError(
            f"EAGLE-3 head {source!r}: hidden_size {head.hidden_size} differs from the target's {target_hidden} "
            "and the checkpoint has no embed_tokens.weight of its own"
        )
