import json
import shutil

import pytest

from mmlens.errors import LayoutError, ProcessorConfigError
from mmlens.layout.composition import ImageInput
from mmlens.layout.families import get_family
from mmlens.layout.modeldir import load_model_dir, resolve_model
from mmlens.layout.tokenizers import qwen_tokenizer_files, write_shape_faithful_tokenizer

TEXT = "Describe this image in detail please."


def write_dir(path, family, config, processor=None, processor_file="preprocessor_config.json"):
    path.mkdir(parents=True, exist_ok=True)
    fam = get_family(family)
    if fam.tokenizer == "qwen":
        for name in ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json"):
            shutil.copy(qwen_tokenizer_files() / name, path / name)
    else:
        write_shape_faithful_tokenizer(fam, path)
    tok_cfg = json.loads((path / "tokenizer_config.json").read_text())
    tok_cfg["chat_template"] = fam.chat.jinja()
    (path / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    (path / "config.json").write_text(json.dumps(config))
    if processor is not None:
        (path / processor_file).write_text(
            processor if isinstance(processor, str) else json.dumps(processor))
    return path


def test_qwen3_vl_directory_renders_like_smg(tmp_path):
    folder = write_dir(tmp_path / "Qwen3-VL-2B-Instruct", "qwen3-vl",
                       {"model_type": "qwen3_vl", "image_token_id": 151655},
                       {"patch_size": 16, "merge_size": 2, "temporal_patch_size": 2,
                        "size": {"shortest_edge": 65536, "longest_edge": 16777216}})
    model = load_model_dir(folder)
    assert model.family.name == "qwen3-vl" and not model.tokenizer.synthetic
    layout = model.layout([ImageInput(64, 64), TEXT])
    assert len(layout.anchor) == 18 and len(layout.router) == 81
    assert model.layout([ImageInput(640, 480), TEXT]).images[0].tokens == 300


def test_the_directorys_processor_config_drives_the_count(tmp_path):
    folder = write_dir(tmp_path / "q3", "qwen3-vl", {"model_type": "qwen3_vl"},
                       {"patch_size": 16, "merge_size": 2, "min_pixels": 200704,
                        "max_pixels": 1003520})
    assert load_model_dir(folder).layout([ImageInput(224, 224), "x"]).images[0].tokens == 196


@pytest.mark.parametrize("where", ["preprocessor_config.json", "processor_config.json"])
def test_glm53_reads_flat_or_nested_processor_config(tmp_path, where):
    values = {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14}
    body = values if where == "preprocessor_config.json" else {"image_processor": values}
    folder = write_dir(tmp_path / "GLM-5.3-Flash", "glm-5.3-flash",
                       {"model_type": "glm53_flash", "image_token_id": 151363}, body, where)
    model = load_model_dir(folder)
    assert model.family.name == "glm-5.3-flash"
    assert model.tokenizer.synthetic
    layout = model.layout([ImageInput(640, 480), TEXT])
    assert layout.images[0].tokens == get_family("glm-5.3-flash").image_token_count(
        640, 480, values)


def test_glm53_without_processor_config_is_refused(tmp_path):
    folder = write_dir(tmp_path / "g", "glm-5.3-flash", {"model_type": "glm53_flash"})
    with pytest.raises(ProcessorConfigError, match="not guessed"):
        load_model_dir(folder)


@pytest.mark.parametrize("bad", ['{"patch_size": "14"}', "{not json", "[1, 2]"])
def test_glm53_with_malformed_processor_config_is_refused(tmp_path, bad):
    folder = write_dir(tmp_path / "g", "glm-5.3-flash", {"model_type": "glm53_flash"}, bad)
    with pytest.raises(ProcessorConfigError):
        load_model_dir(folder)


def test_directory_without_config_json_is_refused(tmp_path):
    with pytest.raises(LayoutError, match=r"config\.json"):
        load_model_dir(tmp_path)


def test_resolve_model_by_family_name():
    model = resolve_model("Qwen/Qwen3-VL-8B-Instruct")
    assert model.family.name == "qwen3-vl" and model.path is None
    with pytest.raises(LayoutError, match="processor config"):
        resolve_model("glm-5.3-flash")


def test_chat_template_of_each_family_emits_its_anchor(tmp_path):
    from mmlens.layout.families import FAMILIES

    for fam in FAMILIES:
        if fam.tokenizer == "qwen":
            continue
        folder = write_dir(tmp_path / fam.name, fam.name,
                           {"model_type": fam.model_types[0]}, {"min_pixels": 3136,
                           "max_pixels": 12845056, "patch_size": 14})
        model = load_model_dir(folder)
        layout = model.layout([ImageInput(64, 64), "hi", ImageInput(32, 32)])
        assert len(layout.images) == 2, fam.name
        rendered = fam.chat.render([None, "hi", None])
        assert list(layout.anchor.token_ids) == model.tokenizer.encode(rendered), fam.name
