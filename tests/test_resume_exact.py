

def test_a_named_or_single_file_model_has_a_fingerprint_without_being_converted(tmp_path):
    # `--model smollm2-135m-instruct` is a name, not a directory: the identity must not list it
    from taurl.recipe.resume import model_fingerprint

    assert model_fingerprint("smollm2-135m-instruct") == "name:smollm2-135m-instruct"
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(range(256)) * 10)
    first = model_fingerprint(gguf)
    gguf.write_bytes(b"GGUF" + bytes(range(255, -1, -1)) * 10)
    assert model_fingerprint(gguf) != first
