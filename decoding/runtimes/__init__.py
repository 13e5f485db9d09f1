"""Decoding inside other libraries' generation loops: ``hf`` runs an exported head in transformers' ``generate()``,
``hf_export`` writes it as a transformers ``custom_generate`` folder."""
