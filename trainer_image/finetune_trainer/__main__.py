import sys

from finetune_trainer.main import main

sys.exit(main())
