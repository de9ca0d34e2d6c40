"""Built-in texts that calibrate what depends on a model's activations: int8 graphs' ranges (compile) and
int8/uint8 embeddings' per-dimension ranges (runtime/quantization.py). Several languages and lengths, since
ranges depend on both; nothing here is downloaded.
"""

from __future__ import annotations

CALIBRATION_QUERIES = (
    "how do vaccines train the immune system",
    "best hiking trails near zurich",
    "Wie funktioniert ein Elektromotor?",
    "python list comprehension example",
    "symptoms of vitamin d deficiency",
    "¿cuál es la capital de australia?",
)
CALIBRATION_PASSAGES = (
    "Photosynthesis converts light energy into chemical energy stored in glucose, releasing oxygen as a by-product.",
    "The stock market fell sharply after the central bank raised interest rates by half a percentage point on Tuesday.",
    "La tour Eiffel a été construite pour l'Exposition universelle de 1889 et mesure environ 330 mètres.",
    "In 1969, Apollo 11 landed the first humans on the Moon; Neil Armstrong stepped onto the surface first, "
    "followed by Buzz Aldrin, while Michael Collins stayed in lunar orbit aboard the command module.",
    "A transformer encoder reads the whole sentence at once, so every token attends to every other token in both "
    "directions; this is why encoders suit retrieval and classification rather than generation.",
    "東京は日本の首都であり、世界最大の都市圏の一つです。",
    "Return policy: items can be returned within 30 days with the receipt. Refunds go to the original payment method "
    "within five business days; gift cards and final-sale items cannot be returned.",
    "The mitochondrion is the powerhouse of the cell. It produces ATP through oxidative phosphorylation, a process "
    "that depends on a gradient of protons across the inner membrane. " * 3,
)


SHORT_TEXTS = ("a", "the", "ok", "yes please", "thanks", "x y")


def word_windows() -> list[str]:
    """Windows of 40 to 400 words from the passages, three of each length."""
    words = " ".join(CALIBRATION_PASSAGES).split()
    return [" ".join(words[start : start + n]) for n in (40, 90, 180, 400) for start in (0, 37, 81)]


def calibration_texts() -> list[str]:
    return [*CALIBRATION_QUERIES, *CALIBRATION_PASSAGES, *SHORT_TEXTS, *word_windows()]
