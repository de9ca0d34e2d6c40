"""RoBERTa and XLM-RoBERTa: no segment input, and positions that start after padding_idx."""

from encoderrt.models.architecture import Architecture

ARCHITECTURE = Architecture(
    name="roberta",
    model_types=("roberta", "xlm-roberta"),
    uses_token_type_ids=False,
    classifier_input="first_token",
    position_offset_from_padding=True,
    packed_layout=True,
)
