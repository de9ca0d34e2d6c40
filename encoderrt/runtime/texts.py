"""Built-in texts that calibrate what depends on a model's activations: int8 graphs' ranges (compile) and
int8/uint8 embeddings' per-dimension ranges (runtime/quantization.py). Every kind of text users embed, since
ranges depend on it: prose in several languages and scripts, code, tables and markup, lists, repeated words,
short queries and 400-word windows; nothing here is downloaded. Compile's parity probes (compile/parity.py) are
other texts of the same kinds, so the figure it reports is measured on text the calibration never saw.
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
    "def merge(a, b):\n    out = []\n    while a and b:\n        out.append(a.pop(0) if a[0] < b[0] else b.pop(0))\n"
    "    return out + a + b",
    "| city | population | area km² |\n|---|---|---|\n| Zurich | 421,878 | 87.9 |\n| Geneva | 203,856 | 15.9 |\n"
    "| Basel | 173,863 | 23.9 |",
    "<ul class=\"nav\"><li><a href=\"/docs\">Docs</a></li><li><a href=\"/pricing\">Pricing</a></li></ul>",
    "Ingredients:\n- 2 eggs\n- 150 g flour\n- 1 tsp salt\n- 300 ml milk",
    "buy buy buy buy buy now now now now now cheap cheap cheap cheap cheap deal deal deal deal deal",
    "القاهرة هي عاصمة مصر وأكبر مدنها، ويعبرها نهر النيل.",
    "भारत की राजधानी नई दिल्ली है।",
    "서울은 대한민국의 수도이며 한강이 도시를 가로지른다.",
)


SHORT_TEXTS = ("o", "the", "ok", "yes please", "thanks", "x y")


def word_windows() -> list[str]:
    """Windows of 40 to 400 words from the passages, three of each length."""
    words = " ".join(CALIBRATION_PASSAGES).split()
    return [" ".join(words[start : start + n]) for n in (40, 90, 180, 400) for start in (0, 37, 81)]


def calibration_texts() -> list[str]:
    return [*CALIBRATION_QUERIES, *CALIBRATION_PASSAGES, *SHORT_TEXTS, *word_windows()]
