"""Object keys become paths under the directory they are downloaded into: a key that climbs out of it is refused
with its name, before anything is written (S3 stores keys such as `m/../../x.py` as they are)."""

import pytest

from finetune_trainer.errors import ConfigError
from finetune_trainer.objectstore import RemoteFile, relative

URI = "s3://bucket/models/tiny"


@pytest.mark.parametrize("name", ["config.json", "sub/dir/tokenizer.json", "a..b.safetensors", "..hidden.py"])
def test_a_name_under_the_prefix_is_its_path(name):
    assert relative(RemoteFile(f"{URI}/{name}", 1, "e"), URI) == name


@pytest.mark.parametrize("name", ["../escaped.py", "sub/../../escaped.py", "..", "sub/./x.py", "sub//x.py", "x/",
                                  ""])
def test_a_name_that_would_climb_out_is_refused_with_it(name):
    with pytest.raises(ConfigError, match="outside the directory") as refused:
        relative(RemoteFile(f"{URI}/{name}", 1, "e"), URI)
    assert f"{URI}/{name}" in str(refused.value)
