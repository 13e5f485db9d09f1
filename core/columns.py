"""What the label shards' feature columns hold: one description each, written into every manifest and every exported
head that reads the column (no imports, so that an exported ``custom_generate`` folder can carry it)."""

FEATURE_COLUMNS = {
    "hidden": "draft last-layer hidden state (after the final norm) after reading the token",
    "hidden_prev": "the same at the previous position: the state that produced q for the token",
    "hidden_layers": "outputs of the draft layers `tapped_layers` (each scaled to unit RMS) after reading the token",
    "hidden_layers_prev": "the same at the previous position",
    "stale_hidden_target": "the target's last hidden state at its last call, round_index positions back",
}
