"""Training of heads on label shards: data module, one generic LightningModule, LightningCLI, ``make train``."""
