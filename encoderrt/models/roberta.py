"""RoBERTa, XLM-RoBERTa and CamemBERT (RoBERTa's graph under its own name): no segment input, and
positions that start after padding_idx."""

from encoderrt.models.architecture import Architecture

ARCHITECTURE = Architecture(
    name="roberta",
    model_types=("roberta", "xlm-roberta", "camembert"),
    uses_token_type_ids=False,
    classifier_input="first_token",
    position_offset_from_padding=True,
    packed_layout=True,
)
