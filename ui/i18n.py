"""The interface text in English and Simplified Chinese.

Gradio translates these in the browser, following its language, so only fixed text (labels,
buttons, help) goes here; what the model writes and the numbers of a run are shown as they are.
"""
import re

import gradio as gr

from serve.inspection import MAX_TOKENS
from serve.tracing import NOISE_SAMPLES
from serve.messages import LABELS_ZH

# How the stop strings box reads its lines (serve.running.stop_lines).
STOP_HOW = ("One a line; type \\n for a line end, \\t for a tab, \\\\ for a backslash. The text ends where one "
            "is written, without it.")
STOP_HOW_ZH = "每行一个；用 \\n 表示换行，\\t 表示制表符，\\\\ 表示反斜杠。文本在写出其中之一处结束，且不含它。"

ENGLISH = {
    "title": "# Pre-LN GPT-2 Studio",
    "subtitle": "GPT-2 written from scratch with Pre-Layer Normalization, tried on four tasks. "
                "Every run reports its seed, so any result can be reproduced.",
    "model": "Model",
    "switch_model": "Switch model",
    "switch_model_info": "the models this app was started with",
    # for whoever runs the app: a visitor to a Space can only read that there is one
    "switch_model_info_one": "this app serves one model. Running it yourself? Start it with --model more than once "
                             "(--model bundled --model gpt2) to switch between models here",
    "switch_model_info_loadable": "the models this app serves: those it was started with, and those loaded below",
    # shown only where the app allows loading (app.py --allow-load)
    "load_model": "Load a model (hub id or local path)",
    "load_model_info": "a Hugging Face hub id (gpt2, distilgpt2, or any GPT-2 repo) or a local checkpoint directory; "
                       "it joins the list above and is served to everyone using the app",
    "load_model_button": "Load",
    "unload_model_button": "Unload the selected model",
    # tabs
    "tab_generate": "Generate",
    "tab_dialogue": "Chat",
    "tab_translate": "Translate",
    "tab_summarize": "Summarise",
    "tab_architecture": "Architecture",
    # what each task tab does, the line at its top
    "intro_generate": "The model continues your text. **Continue** adds what it wrote to the prompt, "
                      "so you can correct it and go on.",
    "intro_dialogue": "Talk with the model. The persona sets the scene; each reply is the model's next line "
                      "in the transcript.",
    "intro_translate": "Translate a sentence between English, French and German. With the adapter off, the "
                       "example pairs show the model what to do.",
    "intro_summarize": "Summarise a text or a conversation: the model reads it followed by `TL;DR:` (\"too long; "
                       "didn't read\", the cue GPT-2's paper used), and the first line it writes is the "
                       "summary.",
    # how the bundled model does at the task (its card, assets/README.md): shown while it is served
    "bundled_translate": "The bundled model translates everyday sentences about as well as looking up the most "
                         "similar sentence it was trained on, and unusual ones much worse.",
    "bundled_summarize": "For a fable, the bundled model writes a lesson in the right form, but it scores worse "
                         "than answering every fable with the same stock lesson.",
    # buttons
    "generate": "Generate",
    "send": "Send",
    "run_translate": "Translate",
    "run_summarize": "Summarise",
    "stop": "Stop",
    "continue": "Continue",
    "export_conversation": "Export conversation (JSON)",
    "import_conversation": "Import conversation (JSON)",
    "new_chat": "New chat",
    "earlier_conversations": "Earlier conversations",
    "conversation_tools": "Earlier conversations, export and import",
    "replies_to_last": "Replies to your last message:",
    "earlier_conversations_info": "kept in this browser, newest first: each by its first message, with its "
                                  "number of turns in brackets; pick one to go on with it",
    # task inputs and outputs
    "prompt": "Prompt",
    "continuation": "Continuation",
    "conversation": "Conversation",
    "message": "Message",
    "message_placeholder": "Say something and press Enter",
    "persona": "Persona",
    "persona_placeholder": "e.g. Bot takes drink orders at a coffee shop.",
    "prompt_placeholder": "The start of a story for the model to go on with, e.g. Once upon a time, a little fox",
    "source_text_placeholder": "A short sentence, e.g. My book is on the table.",
    "article_placeholder": "A fable, a short story or a conversation to sum up",
    "source_text": "Text to translate",
    "source_language": "From",
    "target_language": "To",
    "example_pairs": "Example pairs",
    "example_pairs_info": "one per line: source = target. Sent only with the adapter off, for the model to continue "
                          "their pattern; the adapter learned the task, so with it on the prompt holds none. Pairs "
                          "of your own, or none, go after a line naming the two languages (English = Deutsch)",
    "example_pairs_through_english": "French <-> German goes through English, each step with its own built-in "
                                     "pairs, so these are not sent; pairs of your own here ask for the direct "
                                     "translation (sent only with the adapter off)",
    "example_pairs_unsent": "not sent while the adapter is on (it learnt the task without them): switch it off, "
                            "or compare the adapter off and on, to use and edit them",
    "example_pairs_kept": "your own pairs, kept when the languages changed: check that they suit the new pair "
                          "(empty the box before picking the languages to get the built-in pairs)",
    "translation": "Translation",
    "swap_languages": "Swap the languages",
    "English": "English",
    "French": "French",
    "German": "German",
    "article": "Article",
    "summary": "Summary",
    # every tab
    "adapter": "Adapter",
    "adapter_info": "switch on the fine-tuned adapter for this task",
    # Off by default where the model's evaluation found the adapter no better than the prompt alone
    # (or the model has no evaluation): said, so that the off does not look like a mistake.
    "adapter_info_off": "off at first: this model's evaluation did not find it better than the prompt alone; "
                        "switch it on to try it",
    "lens_adapter": "Adapter for the logit lens",
    "lens_adapter_info": "with one on, red outlines the layers and tokens where it changes the top-1",
    "logit_lens": "Logit lens: what each layer would predict (ln_f and the tied head on the residual stream)",
    "adapter_scale": "Adapter strength",
    "adapter_scale_info": "how much of the adapter's change to the weights to add: 0 = none (the base model, "
                          "given the adapter's prompt), 1 = as trained; it acts only while the adapter is on or you compare it off and on",
    "look_inside_output": "Why this output: tokens, alternatives, side by side",
    "show_tokens": "Show tokens",
    "show_tokens_info": "each token coloured by its probability, with the alternatives at that step",
    "compare": "Compare side by side",
    "compare_info": "the same request twice at once, under one seed, with one thing different: pick what",
    "compare_off": "Off",
    "compare_adapter": "Adapter off and on",
    "compare_steering": "Steering off and on (set a strength under Steer)",
    "compare_model": "Another model",
    "compare_setting": "One decoding setting",
    "compare_model_pick": "Model of the second side",
    "compare_model_info": "the first side runs on the model served; load more in the Model panel",
    "compare_setting_pick": "Setting",
    "compare_value": "Its value on the second side",
    "compare_value_info": "the first side keeps the value under Decoding settings",
    "compare_first": "First side",
    "compare_second": "Second side",
    "steer": "Steer",
    "steer_intro": "Adds strength × v to the residual stream after a layer, where v is the mean difference "
                   "between the model's residual at the last token of each positive line and of its negative "
                   "line (the i-th lines form a pair). Strength 0 is off. With a strength set, Compare's "
                   "*Steering off and on* shows the run unsteered and steered under one seed. *Export* writes "
                   "the vector as a llama.cpp control vector (GGUF) and as safetensors with its lines; *Import* "
                   "steers by such a file.",
    "steer_positive": "Towards (positive lines)",
    "steer_positive_info": "one text a line",
    "steer_negative": "Away from (negative lines)",
    "steer_negative_info": "as many lines as the positive",
    "steer_layer": "Layer",
    "steer_layer_info": "0 = after the embeddings; the last = after the last block",
    "steer_strength": "Strength",
    "steer_strength_info": "0 = off; negative steers away from the positive lines",
    "steer_happier": "Preset: happier",
    "steer_sadder": "Preset: sadder",
    "steer_export": "Export the vector",
    "steer_import": "Import a vector file",
    "steer_files": "The vector as files",
    "alternatives": "Alternatives",
    "alternatives_info": "pick one to continue from it, with the same settings and seed",
    "no_adapter_task": "this task has no fine-tuned adapter",
    "no_adapter_model": "the loaded model has no adapter for this task",
    "settings": "Decoding settings",
    "preset": "Preset",
    "preset_info": "pick one to set the settings below; those you save are kept in this browser, for this tab",
    "preset_name": "Save the settings below as",
    "preset_name_placeholder": "a name, e.g. Short and safe",
    "preset_save": "Save preset",
    "preset_delete": "Delete preset",
    "temperature": "Temperature",
    "temperature_info": "0 = greedy",
    "top_k": "Top-k",
    "top_k_info": "0 = off",
    "top_p": "Top-p",
    "top_p_info": "1 = off",
    "min_p": "Min-p",
    "min_p_info": "0 = off; drops tokens less likely than this share of the likeliest",
    "typical_p": "Typical-p",
    "typical_p_info": "1 = off; keeps the tokens nearest the expected surprise, up to this probability mass",
    "repetition_penalty": "Repetition penalty",
    "repetition_penalty_info": "1 = off",
    "presence_penalty": "Presence penalty",
    "presence_penalty_info": "0 = off; lowers each token already written by this much (negative: raises it)",
    "frequency_penalty": "Frequency penalty",
    "frequency_penalty_info": "0 = off; lowers each token already written by this much for every time it was "
                              "written (the prompt does not count)",
    "no_repeat_ngram_size": "No-repeat n-gram size",
    "no_repeat_ngram_size_info": "0 = off",
    "stop_strings": "Stop strings",
    "stop_strings_info": STOP_HOW,
    "stop_strings_info_own": STOP_HOW + " The task's own always apply too: ",
    "stop_strings_info_own_adapter": STOP_HOW + " The task's own always apply too (and with the adapter on, the line "
                                                "end \\n): ",
    "max_new_tokens": "Max new tokens",
    "seed": "Seed",
    "seed_info": "-1 (or empty): a random seed, reported after the run",
    "prompt_sent": "Prompt sent to the model",
    "examples": "Examples",
    "generating": "generating…",
    # architecture tab
    "architecture_intro": """## Where GPT-2 puts its LayerNorms

GPT-2 is a **Pre-LN** Transformer: each block normalises the *input* of its attention and MLP
sub-blocks and adds their output back to a residual stream that is never normalised on the way.
One last LayerNorm, `ln_f`, normalises the stream before the output layer. The original
Transformer is **Post-LN**: it normalises *after* each residual addition.""",
    "pre_ln": "Pre-LN (GPT-2, this app)",
    "post_ln": "Post-LN (original Transformer)",
    "seed_corrections": """**What the article this app started from got wrong.** The article, "GPT-2 中的 Pre-Layer
Normalization (Pre-LN) 架构详解" (an explainer in Chinese, not a paper), explains where GPT-2 puts
its LayerNorms. Its pseudocode has no `ln_f`: GPT-2
has one, and without it the output layer reads the raw residual stream, whose scale nothing
controls (at Xavier initialisation its squared norm grows linearly with depth). It labels
the residual additions "Add & Normalize", but in Pre-LN nothing is normalised there: the
LayerNorm it applies after the addition is the *next* sub-block's input norm (`ln_2`, with its own
gain and bias), and the stream itself carries on unnormalised; "Add & Normalize" is the Post-LN
step. Both placements use two LayerNorms per block, so neither is cheaper to compute. Its claims
that Pre-LN trains faster and more stably come without numbers: the measurements below put them
to the test (`python -m train.lab`, findings in `docs/pre-ln.md`).""",
    "measurements": """## Measurements

What the project measured (every number, and how to re-run it: `docs/pre-ln.md`). At
initialisation, Pre-LN's last-layer gradient falls as 1/√L with depth under Xiong et al.'s Xavier
initialisation, and stays flat under GPT-2's own. In 72 short training runs nothing diverged,
Post-LN without warmup included; but Post-LN stalled near a loss of 6.7 at the higher learning
rate and at 12 layers while Pre-LN kept improving, and warmup did not close the gap.""",
    "gradnorm_caption": "Gradient norms at initialisation (python -m train.lab gradnorm)",
    "train_caption": "Training runs without gradient clipping (python -m train.lab train)",
    "not_measured": "*Not measured yet: run `python -m train.lab` (see docs/pre-ln.md) to make this plot.*",
    "live_view": f"""## Look inside the loaded model

For your prompt (up to {MAX_TOKENS} tokens): the norm of the residual stream after each layer, one
attention head's map over the prompt's tokens (row = a token, columns = the earlier tokens it
attends to), and the ten likeliest next tokens.""",
    "layer": "Layer",
    "head": "Head",
    "look_inside": "Look inside",
    "swipe_sideways": "*Wider than the screen: swipe it sideways to see the rest.*",
    "residual_norms": "Residual stream norm",
    "attention_map": "Attention map",
    "top_tokens": "Top-10 next tokens, of the base model (the adapter below changes the logit lens only)",
    "trace_intro": f"""## Trace: where the answer is carried

Activation patching (causal tracing, as in ROME, Meng et al. 2022), on the base model: the clean
prompt is run, and a corrupted one; then, for each layer and each token, the clean run's activation
there is restored into the corrupted run, and the map shows how much of the answer's probability
comes back: (p_patched − p_corrupted) / (p_clean − p_corrupted), 1 where that activation alone
brings the clean answer back, 0 where it changes nothing. The corruption is another prompt of as
many tokens, or noise on a span of the clean prompt (3 × the embeddings' standard deviation,
averaged over {NOISE_SAMPLES} seeded samples). Three maps, rows the clean prompt's tokens (up to {MAX_TOKENS}),
columns the layers: each block's output (the residual stream), its attention output and its MLP
output.""",
    "clean_prompt": "Clean prompt",
    "corrupted_prompt": "Corrupted prompt",
    "corrupted_prompt_info": "optional: as many tokens as the clean prompt; given, it is used instead of the noise span",
    "noise_span": "Noise span",
    "noise_span_info": "text within the clean prompt whose tokens get noise, where no corrupted prompt is given",
    "answer": "Answer",
    "answer_info": "optional: one token; empty: the clean run's likeliest next token",
    "trace": "Trace",
    "trace_residual": "Residual stream restored (each block's output)",
    "trace_attention": "Attention output restored",
    "trace_mlp": "MLP output restored",
}

CHINESE = {
    **LABELS_ZH,  # what messages name too (serve/messages.py)
    "title": "# Pre-LN GPT-2 工作室",
    "subtitle": "从零实现、采用前置层归一化（Pre-LN）的 GPT-2，在四个任务上试用。每次运行都会报告随机种子，任何结果都可以复现。",
    "model": "模型",
    "switch_model": "切换模型",
    "switch_model_info": "本应用启动时指定的模型",
    "switch_model_info_one": "本应用只提供这一个模型。自己运行本应用时，多次给出 --model（--model bundled --model gpt2）即可在此切换模型",
    "switch_model_info_loadable": "本应用提供的模型：启动时指定的，以及在下方加载的",
    "load_model": "加载模型（hub id 或本地路径）",
    "load_model_info": "Hugging Face 模型库中的名称（gpt2、distilgpt2 或任何 GPT-2 仓库）或本地检查点目录；"
                       "加载后加入上方列表，并提供给所有使用本应用的人",
    "load_model_button": "加载",
    "unload_model_button": "卸载所选模型",
    "tab_generate": "生成",
    "tab_dialogue": "对话",
    "tab_translate": "翻译",
    "tab_summarize": "摘要",
    "tab_architecture": "架构",
    "intro_generate": "模型接着你的文字写下去。**续写**会把它写的内容加到提示词后面，你可以改正后接着写。",
    "intro_dialogue": "和模型对话。角色设定交代场景；每条回复是模型在对话记录里的下一句。",
    "intro_translate": "在英语、法语和德语之间翻译一句话。关闭适配器时，示例句对向模型示范要做什么。",
    "intro_summarize": "为一段文字或一段对话写摘要：模型读完全文和其后的 `TL;DR:`（\"too long; didn't read\"，即“太长不看”，GPT-2 论文用的提示词），写出的第一行就是摘要。",
    "bundled_translate": "内置模型翻译日常句子的水平与查找它训练过的最相似句子相当，翻译不常见的句子则差得多。",
    "bundled_summarize": "内置模型为寓言写的教训形式正确，但得分还不如对每个寓言都给出同一句固定的教训。",
    "generate": "生成",
    "send": "发送",
    "run_translate": "翻译",
    "run_summarize": "生成摘要",
    "stop": "停止",
    "continue": "续写",
    "export_conversation": "导出对话（JSON）",
    "import_conversation": "导入对话（JSON）",
    "new_chat": "新对话",
    "earlier_conversations": "以前的对话",
    "conversation_tools": "以前的对话、导出和导入",
    "replies_to_last": "对最后一条消息的回复：",
    "earlier_conversations_info": "保存在此浏览器中，最新的在前：以第一条消息列出，括号中是对话轮数；选择一个即可继续",
    "continuation": "续写内容",
    "message_placeholder": "输入内容后按回车",
    "persona_placeholder": "例如：Bot takes drink orders at a coffee shop.",
    "prompt_placeholder": "故事的开头，模型会接着写下去，例如：Once upon a time, a little fox",
    "source_text_placeholder": "一个短句，例如：My book is on the table.",
    "article_placeholder": "一则寓言、一个短故事或一段对话，模型会为它写摘要",
    "example_pairs_info": "每行一对：源文 = 译文。仅在适配器关闭时发送，供模型沿用其模式；适配器已学会此任务，开启时提示词中不含示例。"
                          "您自己的示例对（或不写示例）之前会加一行写明两种语言（English = Deutsch）",
    "example_pairs_through_english": "法语与德语互译经由英语进行，每一步使用各自的内置示例，因此不发送这些示例；"
                                     "在此写入您自己的示例对，即可请求直接翻译（仅在适配器关闭时发送）",
    "example_pairs_unsent": "适配器开启时不发送这些示例（它已学会此任务，无需示例）：关闭适配器或对比适配器关与开，即可使用和编辑它们",
    "example_pairs_kept": "这是您自己的示例对，更换语言时保留：请确认它们适合新的语言对（先清空此框再选择语言，即可换回内置示例）",
    "translation": "译文",
    "swap_languages": "交换两种语言",
    "summary": "摘要",
    "adapter": "适配器",
    "adapter_info": "启用此任务微调过的适配器",
    "adapter_info_off": "默认关闭：此模型的评测未发现它比仅用提示词更好；可开启试用",
    "lens_adapter": "logit 透镜使用的适配器",
    "lens_adapter_info": "启用后，红框标出它改变了首选词元的层和位置",
    "logit_lens": "logit 透镜（logit lens）：每一层会预测什么（对残差流施加 ln_f 和共享的输出头）",
    "adapter_scale": "适配器强度",
    "adapter_scale_info": "加入多少适配器对权重的改变：0 = 不加（基础模型，但用适配器的提示词），1 = 训练时的强度。仅在适配器打开或对比适配器关与开时起作用。",
    "look_inside_output": "为什么是这个输出：词元、备选、并排对比",
    "show_tokens": "显示词元",
    "show_tokens_info": "每个词元按概率着色，并列出该步的备选",
    "compare": "并排对比",
    "compare_info": "同一请求同时运行两次，使用同一个种子，只有一处不同：在此选择哪一处",
    "compare_off": "关",
    "compare_adapter": "适配器关与开",
    "compare_steering": "转向关与开（在“转向”中设定强度）",
    "compare_model": "另一个模型",
    "compare_setting": "一项解码设置",
    "compare_model_pick": "第二侧的模型",
    "compare_model_info": "第一侧使用当前提供的模型；可在“模型”面板中加载更多",
    "compare_setting_pick": "设置",
    "compare_value": "它在第二侧的值",
    "compare_value_info": "第一侧保持“解码设置”中的值",
    "compare_first": "第一侧",
    "compare_second": "第二侧",
    "steer": "转向",
    "steer_intro": "在某一层之后给残差流加上 强度 × v，v 是模型在每行正例与对应反例最后一个词元处残差之差的平均"
                   "（第 i 行正例与第 i 行反例为一对）。强度 0 即关闭。设了强度后，“并排对比”的“转向关与开”会在同一个种子下显示未转向与已转向的运行。"
                   "*导出*把向量写成 llama.cpp 控制向量（GGUF）和带文本行的 safetensors 文件；*导入*则按这样的文件转向。",
    "steer_positive": "趋向（正例各行）",
    "steer_negative": "远离（反例各行）",
    "steer_layer": "层",
    "steer_strength": "强度",
    "steer_positive_info": "每行一段文本",
    "steer_negative_info": "行数与正例相同",
    "steer_layer_info": "0 = 嵌入之后；最大值 = 最后一个块之后",
    "steer_strength_info": "0 = 关闭；负数则远离正例",
    "steer_happier": "预设：更开心",
    "steer_sadder": "预设：更难过",
    "steer_export": "导出向量",
    "steer_import": "导入向量文件",
    "steer_files": "向量文件",
    "alternatives": "备选",
    "alternatives_info": "选一个从它继续，设置和种子不变",
    "no_adapter_task": "此任务没有微调适配器",
    "no_adapter_model": "当前模型没有此任务的适配器",
    "settings": "解码设置",
    "preset": "预设",
    "preset_info": "选择一个即可设定下面的设置；您保存的预设只保存在此浏览器中，每个标签页各自一套",
    "preset_name": "把下面的设置保存为",
    "preset_name_placeholder": "一个名称，例如：简短稳妥",
    "preset_save": "保存预设",
    "preset_delete": "删除预设",
    "temperature_info": "0 = 贪心解码",
    "top_k_info": "0 = 关闭",
    "top_p_info": "1 = 关闭",
    "min_p_info": "0 = 关闭；去掉概率低于最可能词元此比例的词元",
    "typical_p_info": "1 = 关闭；保留信息量最接近期望的词元，直到累计概率达到此值",
    "repetition_penalty_info": "1 = 关闭",
    "no_repeat_ngram_size_info": "0 = 关闭",
    "presence_penalty_info": "0 = 关闭；已写出的词元分数减去此值（负数则加上）",
    "frequency_penalty_info": "0 = 关闭；已写出的词元每出现一次，分数减去一次此值（提示词不计）",
    "stop_strings": "停止串",
    "stop_strings_info": STOP_HOW_ZH,
    "stop_strings_info_own": STOP_HOW_ZH + "任务自带的停止串也始终有效：",
    "stop_strings_info_own_adapter": STOP_HOW_ZH + "任务自带的停止串也始终有效（开启适配器时还有换行 \\n）：",
    "seed_info": "-1（或留空）：随机种子，运行后会显示",
    "prompt_sent": "发送给模型的提示词",
    "examples": "示例",
    "generating": "生成中…",
    "architecture_intro": """## GPT-2 把 LayerNorm 放在哪里

GPT-2 是 **Pre-LN**（前置层归一化）Transformer：每个块先对注意力和 MLP 子层的*输入*做归一化，
再把子层的输出加回残差流，残差流本身在途中从不被归一化。最后一个 LayerNorm `ln_f`
在输出层之前对残差流做归一化。原始 Transformer 是 **Post-LN**（后置层归一化）：
在每次残差相加*之后*做归一化。""",
    "pre_ln": "Pre-LN（GPT-2，本应用）",
    "post_ln": "Post-LN（原始 Transformer）",
    "seed_corrections": """**本应用所依据的文章错在哪里。** 这篇文章是《GPT-2 中的 Pre-Layer Normalization (Pre-LN)
架构详解》（一篇中文科普文章，不是论文），讲 GPT-2 把 LayerNorm 放在哪里。它的伪代码没有 `ln_f`：GPT-2 有这一层，少了它，
输出层读到的是未经归一化的残差流，其尺度不受任何控制（在 Xavier 初始化下，其范数的平方随深度线性增长）。它把残差相加标为"Add & Normalize"（相加并归一化），
但在 Pre-LN 中那里什么也没有被归一化：相加之后的 LayerNorm 是*下一个*子层的输入归一化
（`ln_2`，有自己的增益和偏置），残差流本身继续保持未归一化；"Add & Normalize"是 Post-LN
的步骤。两种放置方式每个块都用两个 LayerNorm，谁的计算量也不更小。它说 Pre-LN
训练更快、更稳定，却没有给出数字：下面的实测对这些说法做了检验（`python -m train.lab`，
结论见 `docs/pre-ln.md`）。""",
    "measurements": """## 实测

本项目的测量结果（全部数字及复现方法见 `docs/pre-ln.md`）。初始化时，在 Xiong 等人的 Xavier
初始化下，Pre-LN 最后一层的梯度随深度按 1/√L 下降；在 GPT-2 自己的初始化下则基本不变。在 72 次
短训练中没有一次发散，包括不做预热的 Post-LN；但在较大学习率和 12 层时，Post-LN 的损失停在 6.7
左右，而 Pre-LN 继续下降，预热也没能弥补这一差距。""",
    "gradnorm_caption": "初始化时的梯度范数（python -m train.lab gradnorm）",
    "train_caption": "不做梯度裁剪的训练（python -m train.lab train）",
    "not_measured": "*尚未测量：运行 `python -m train.lab`（见 docs/pre-ln.md）即可生成此图。*",
    "live_view": f"""## 查看当前模型的内部

针对你的提示词（最多 {MAX_TOKENS} 个词元）：每一层之后残差流的范数、某个注意力头在提示词各词元上的注意力图
（每行是一个词元，各列是它关注的前面的词元），以及最可能的十个下一个词元。""",
    "layer": "层",
    "head": "注意力头",
    "look_inside": "查看内部",
    "swipe_sideways": "*比屏幕宽：左右滑动可以看到其余部分。*",
    "residual_norms": "残差流范数",
    "attention_map": "注意力图",
    "top_tokens": "前 10 个候选词元，来自基础模型（下方的适配器只影响 logit 透镜）",
    "trace_intro": f"""## 追踪：答案由哪里携带

激活修补（activation patching，即 ROME 中的因果追踪，Meng 等人 2022），在基础模型上进行：分别运行干净提示词和损坏提示词；
然后对每一层、每个词元，把干净运行在该处的激活恢复到损坏运行中，图中显示答案的概率恢复了多少：
(p_patched − p_corrupted) / (p_clean − p_corrupted)，为 1 表示仅恢复这一处激活就能找回干净运行的答案，为 0 表示毫无改变。
损坏可以是另一个词元数相同的提示词，也可以是在干净提示词的一段上加噪声（嵌入标准差的 3 倍，对 {NOISE_SAMPLES} 个固定种子的样本取平均）。
三张图的行是干净提示词的词元（最多 {MAX_TOKENS} 个），列是层：每个块的输出（残差流）、注意力输出和 MLP 输出。""",
    "clean_prompt": "干净提示词",
    "corrupted_prompt": "损坏提示词",
    "corrupted_prompt_info": "可选：词元数须与干净提示词相同；给出时使用它，而不使用噪声片段",
    "noise_span": "噪声片段",
    "noise_span_info": "干净提示词中的一段文字，未给出损坏提示词时，对其词元加噪声",
    "answer": "答案",
    "answer_info": "可选：一个词元；留空则为干净运行最可能的下一个词元",
    "trace": "追踪",
    "trace_residual": "恢复残差流（每个块的输出）",
    "trace_attention": "恢复注意力输出",
    "trace_mlp": "恢复 MLP 输出",
}


def is_chinese(character: str) -> bool:
    """A CJK character, a full-width punctuation mark (，。（）：) or a dash, quote or ellipsis (—“”…)."""
    return "\u2014" <= character <= "\u2026" or "\u3000" <= character <= "\u9fff" or "\uff00" <= character <= "\uffef"


def unwrapped(text: str) -> str:
    """Text written across source lines, rejoined. Markdown shows a line break inside a paragraph
    as a space, which Chinese puts only next to a Latin word or a number, never between two of its
    own characters. A line that starts a list item, a table row, a heading or code stays a line."""
    return re.sub(r"(?<=[^\n])\n(?=[^\n])(?![-*|#]|\d+\.|```)",
                  lambda m: "" if is_chinese(text[m.start() - 1]) and is_chinese(text[m.end()]) else " ", text)


CHINESE = {key: unwrapped(text) for key, text in CHINESE.items()}

# "zh" as well as "zh-CN": the browser's language may be just "zh", or a variant the front end
# falls back from to "zh".
i18n = gr.I18n(en=ENGLISH, **{"zh-CN": CHINESE, "zh": CHINESE})
