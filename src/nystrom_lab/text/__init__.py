"""The paper's text experiments on the shared loop: MLM + SOP pre-training, Figure 5, fine-tuning and
prediction on GLUE, IMDB or the user's own tables, and checkpoint conversion."""
