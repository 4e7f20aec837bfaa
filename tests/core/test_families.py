import json

import pytest

from mmlens.errors import UnknownFamilyError
from mmlens.layout.families import FAMILIES, family_from_config, get_family


@pytest.mark.parametrize(("key", "family"), [
    ("qwen3-vl", "qwen3-vl"),
    ("Qwen/Qwen3-VL-2B-Instruct", "qwen3-vl"),
    ("qwen3_5_moe", "qwen3-vl"),
    ("Qwen/Qwen2.5-VL-7B-Instruct", "qwen2.5-vl"),
    ("Qwen/Qwen2-VL-7B-Instruct", "qwen2-vl"),
    ("moonshotai/Kimi-K2.5", "kimi-k2.5"),
    ("kimi_k3", "kimi-k3"),
    ("moonshotai/Kimi-K3-Instruct", "kimi-k3"),
    ("zai-org/GLM-4.5V", "glm-4v"),
    ("glm53_flash", "glm-5.3-flash"),
    ("zai-org/GLM-5.3-Flash", "glm-5.3-flash"),
    ("llava-hf/llava-1.5-7b-hf", "llava-1.5"),
    ("llava-hf/llava-v1.6-mistral-7b-hf", "llava-next"),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "llama-4"),
    ("NemotronH_Nano_Omni_Reasoning_V3", "nemotron-omni"),
])
def test_family_detection_by_name_type_or_id(key, family):
    assert get_family(key).name == family


def test_unknown_family_names_the_known_ones():
    with pytest.raises(UnknownFamilyError) as err:
        get_family("mistral-7b")
    for fam in FAMILIES:
        assert fam.name in str(err.value)


@pytest.mark.parametrize(("config", "family"), [
    ({"model_type": "qwen3_vl"}, "qwen3-vl"),
    ({"model_type": "glm53_flash"}, "glm-5.3-flash"),
    ({"architectures": ["Qwen2_5_VLForConditionalGeneration"]}, "qwen2.5-vl"),
    ({"architectures": ["LlavaNextForConditionalGeneration"]}, "llava-next"),
    ({"architectures": ["Llama4ForConditionalGeneration"]}, "llama-4"),
])
def test_family_detection_from_config_json(config, family):
    assert family_from_config(json.loads(json.dumps(config))).name == family


def test_unknown_config_is_refused():
    with pytest.raises(UnknownFamilyError, match="matches no known family"):
        family_from_config({"model_type": "bert"})


def test_smg_worker_expandability_as_smg_1_13_declares_it():
    expandable = {f.name for f in FAMILIES if f.smg_worker_expandable}
    assert expandable == {"qwen3-vl", "llama-4", "glm-5.3-flash"}
    assert get_family("kimi-k3").smg_spec == "kimi_k3"


def test_dynamo_exact_mm_routing_families():
    fallback = {f.name for f in FAMILIES if f.dynamo_prompt_kind is None}
    assert {"glm-4v", "glm-5.3-flash", "llama-4"} <= fallback
    assert get_family("kimi-k3").dynamo_prompt_kind == "KimiK3"
