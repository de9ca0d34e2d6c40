import pytest

from encoderrt.models import UnsupportedArchitecture, find_architecture, supported_model_types


def test_families():
    assert find_architecture("bert").uses_token_type_ids
    roberta = find_architecture("xlm-roberta")
    assert roberta.name == "roberta" and roberta.input_names == ("input_ids", "attention_mask")
    assert roberta.max_positions({"max_position_embeddings": 514, "pad_token_id": 1}) == 512
    assert find_architecture("bert").max_positions({"max_position_embeddings": 512}) == 512
    assert supported_model_types() == ["bert", "roberta", "xlm-roberta"]


def test_unknown_family_names_the_supported_ones():
    with pytest.raises(UnsupportedArchitecture, match="model_type 'llama'.*bert, roberta, xlm-roberta"):
        find_architecture("llama")
