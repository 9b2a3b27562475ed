"""Names and defaults of the data layer that the command line shows in its help and checks options
against, importable without numpy or torch (``nystrom --help`` must not load them)."""

#: the paper's fine-tuning tasks (GLUE folders or aclImdb/)
FINETUNE_TASKS = ("sst2", "mrpc", "qnli", "qqp", "mnli", "imdb")
#: Pathfinder contour length -> the folder the LRA release keeps its images in
DIFFICULTY_DIRS = {6: "curv_baseline", 9: "curv_contour_length_9", 14: "curv_contour_length_14"}
MASK_PROB = 0.15  # BERT: share of the tokens predicted
SHORT_SEQ_PROB = 0.1  # BERT: share of instances with a shorter target length
DUPE_FACTOR = 10  # BERT's create_pretraining_data default: draws of masks per training pair
SPLIT_SALT = {"train": 0, "dev": 1}  # seeds the two splits' masks apart
