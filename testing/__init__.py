"""What the tests and the smoke run decode and label with, nothing downloaded: tiny random-init draft/target pairs
(``testing.tiny``) and stub models with hand-written logits (``testing.stubs``). Only ``tests/`` and ``scripts/``
import it."""
