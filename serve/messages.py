"""The messages a user can get, in the user's language.

Whatever finds a refusal or a note says it as a key and its fields (tasks/messages.py: Message,
Refusal); the text of each key, in English and Chinese, is here, and a message becomes text only at
the edge: the page's status line in the language the browser asks for (its Accept-Language, or the
one picked in Settings), the APIs' errors in English. Text that Gradio translates in the browser
(gr.I18n) must be fixed when the page is built; these carry the request's own numbers and names.
A field may itself be a Message (a refusal within another), a name the app uses (a setting, a box,
a language: said in Chinese as the page labels it), a number (formatted as its template says), or
text of the user's or the model's, said as it is.
"""
from __future__ import annotations

import json
from typing import Any

from engine.generate import ContextLengthError
from tasks.messages import Message, Refusal

__all__ = ["Message", "Refusal", "TEMPLATES", "render", "english", "localized", "message_of", "said"]

# key: (the English text with {fields}, its Chinese)
TEMPLATES: dict[str, tuple[str, str]] = {
    # a seed the app refuses (serve/running.py); -1: serve.running.RANDOM_SEED (tests/test_messages.py checks it)
    "random_seed": ("{error}; -1 draws a random seed", "{error}；设为 -1 则随机抽取种子"),
    # an imported conversation the API would refuse (ui/tabs/chat.py)
    "in_the_file": ("in the file: {error}", "文件中：{error}"),
    # decoding settings (serve/limits.py)
    "temperature_low": ("temperature must be 0 (greedy) or at least {low}, got {value}",
                        "温度必须为 0（贪心）或至少 {low}，收到的是 {value}"),
    "stop_strings": ("stop must be at most {count} non-empty strings of at most {length} characters",
                     "停止串最多 {count} 个，每个须非空且不超过 {length} 个字符"),
    "stop_strings_own": ("stop must be at most {count} non-empty strings of at most {length} characters (the task "
                         "adds its own {own})", "除任务自带的 {own} 个外，停止串最多 {count} 个，每个须非空且不超过 {length} 个字符"),
    "stop_kind": ("stop must be text, one stop string a line, or a list of strings; got {kind}",
                  "停止串必须是文本（每行一个）或字符串列表，收到的是 {kind}"),
    "not_integer": ("{name} must be an integer, got {value}", "{name}必须是整数，收到的是 {value}"),
    "not_number": ("{name} must be a number, got {value}", "{name}必须是数字，收到的是 {value}"),
    "out_of_range": ("{name} must be between {low:,} and {high:,}, got {value}",
                     "{name}必须在 {low:,} 到 {high:,} 之间，收到的是 {value}"),
    "prompt_empty_tokens": ("the prompt is empty", "提示词为空"),
    # the Architecture tab's live view (serve/inspection.py)
    "live_view_tokens": ("the prompt has {tokens:,} tokens; the live view takes at most {most:,}",
                         "提示词有 {tokens:,} 个词元；实时视图最多接受 {most:,} 个"),
    # the Architecture tab's trace (serve/tracing.py)
    "trace_tokens": ("the {name} has {tokens:,} tokens; a trace takes at most {most:,}",
                     "{name}有 {tokens:,} 个词元；追踪最多接受 {most:,} 个"),
    "trace_lengths": ("the corrupted prompt has {corrupted:,} tokens and the clean prompt {clean:,}: a trace needs "
                      "as many in both", "损坏提示词有 {corrupted:,} 个词元，干净提示词有 {clean:,} 个：追踪要求两者词元数相同"),
    "trace_no_corruption": ("give a corrupted prompt, or a noise span: a piece of the clean prompt to add noise to",
                            "请给出损坏提示词，或噪声片段：干净提示词中要加噪声的一段"),
    "noise_span_missing": ("the noise span '{span}' is not in the clean prompt", "噪声片段「{span}」不在干净提示词中"),
    "answer_one_token": ("the answer must be one token; '{answer}' is {tokens:,}",
                         "答案必须是一个词元；「{answer}」是 {tokens:,} 个"),
    "trace_no_effect": ("the corruption leaves the probability of the answer {answer} where it was ({probability:.4g}): "
                        "there is no effect to trace", "损坏没有改变答案 {answer} 的概率（{probability:.4g}）：没有可追踪的效果"),
    # a prompt the engine cannot take (engine.generate.ContextLengthError)
    "prompt_fills_context": ("the prompt is {tokens:,} tokens; the context window is {context:,} tokens and at least "
                             "one must be left to generate",
                             "提示词有 {tokens:,} 个词元；上下文窗口为 {context:,} 个词元，至少要留一个用于生成"),
    # fitting a prompt into the context (tasks/base.py)
    "too_long_shorten": ("{what}: {tokens:,} tokens, but only {room:,} fit in the context next to max_new_tokens; "
                         "shorten it, or set max_new_tokens to {most:,} or less",
                         "{what}：需要 {tokens:,} 个词元，但留出最大新词元数后，上下文只容得下 {room:,} 个；"
                         "请缩短它，或把最大新词元数设为 {most:,} 或更少"),
    "too_long_context": ("{what}: {tokens:,} tokens, but only {room:,} fit in the context next to max_new_tokens; "
                         "shorten it: the model's whole context is {context:,} tokens",
                         "{what}：需要 {tokens:,} 个词元，但留出最大新词元数后，上下文只容得下 {room:,} 个；"
                         "请缩短它：模型的整个上下文只有 {context:,} 个词元"),
    "empty": ("{name} is empty", "{name}为空"),
    "no_letters": ("the text to translate has no letters: there are no words in it to translate",
                   "要翻译的文本中没有文字：其中没有可翻译的词"),
    "no_letters_article": ("the article has no letters: there are no words in it to summarise",
                           "文章中没有文字：其中没有可概括的词"),
    "no_task_adapter": ("the {task} task has no adapter", "任务 {task} 没有适配器"),
    "no_model_adapter": ("this model has no '{adapter}' adapter (it has: {adapters})",
                         "此模型没有「{adapter}」适配器（已有：{adapters}）"),
    "languages": ("cannot translate {source} to {target}: source and target must be two different languages of "
                  "{languages}", "无法从{source}翻译为{target}：源语言和目标语言必须是 {languages} 中两种不同的语言"),
    # the requests' checks (serve/running.py, serve/apis.py, ui/tabs/chat.py)
    "not_text": ("{name} must be text, got {kind}", "{name}必须是文本，收到的是 {kind}"),
    "too_big": ("{name} is too long: {size:,} characters; the limit is {limit:,}",
                "{name}太长：{size:,} 个字符；上限为 {limit:,}"),
    "too_many": ("too many {what}: {count:,}; the limit is {limit:,}", "{what}太多：{count:,}；上限为 {limit:,}"),
    "adapter_bool": ("adapter must be true or false, got {value}", "适配器必须为 true 或 false，收到的是 {value}"),
    "history_pairs": ("history must be a list of [user, bot] pairs of text", "对话历史必须是 [用户, 机器人] 文本对的列表"),
    "no_retry": ("there is no turn to retry", "没有可以重试的一轮"),
    # a Chat reply written over by hand (serve.outcome.Outcome.edited): no run to describe
    "edited_by_hand": ("edited by hand: the model reads it as its own reply; no seed or token probabilities, since "
                       "no run wrote it", "已手动编辑：模型会把它当作自己的回复；没有种子和词元概率，因为它不是运行生成的"),
    "same_seed": ("the same seed gives the same reply: a seed of -1 draws a new one each time",
                  "相同的种子给出相同的回复：种子设为 -1 则每次抽取新的"),
    "greedy_same": ("greedy decoding (temperature 0 or top_k 1) gives the same reply each time",
                    "贪心解码（温度 0 或 Top-k 1）每次给出相同的回复"),
    "not_a_conversation": ("the file is not an exported conversation ({kind})", "该文件不是导出的对话（{kind}）"),
    "unreadable_file": ("the file could not be read", "无法读取该文件"),
    "example_line": ("example pairs line {number} is not 'source = target': {line}",
                     "示例第 {number} 行不是「源 = 目标」格式：{line}"),
    "generation_failed": ("the generation failed ({kind}); the app is still serving, please try again",
                          "生成失败（{kind}）；应用仍在运行，请重试"),
    # a comparison's request (serve/comparing.py) and the /compare endpoint's (serve/running.py, TaskAPI.request)
    "one_of": ("{name} must be one of {choices}, got {value}", "{name}必须是 {choices} 之一，收到的是 {value}"),
    "compare_model": ("{name} names the model {model}, which is not one of the models here ({names})",
                      "{name}指定的模型 {model} 不在本应用的模型之中（{names}）"),
    "compare_setting": ("{name} names the setting {setting}, which is not a decoding setting ({names})",
                        "{name}指定的设置 {setting} 不是解码设置（{names}）"),
    "compare_value": ("{name}: {error}", "{name}：{error}"),
    "compare_no_steering": ("comparing the steering needs a steering to switch on: set {fields}",
                            "对比转向需要先设定转向：请设置{fields}"),
    "values_object": ("{name} must be an object of {api}'s parameters, got {kind}",
                      "{name}必须是由 {api} 的参数组成的对象，收到的是 {kind}"),
    "unknown_parameter": ("{api} takes no parameter {name} (it takes: {names})", "{api} 没有参数 {name}（它的参数：{names}）"),
    "missing_parameter": ("{name} is missing: {api} needs it", "缺少{name}：{api} 需要它"),
    # the queue every run of the model takes its turn in (serve/admission.py)
    "queue_full": ("the queue is full: {capacity} requests are running or waiting; please try again in a few seconds",
                   "队列已满：{capacity} 个请求正在运行或等待；请过几秒再试"),
    "waiting": ("waiting for the model: number {place} in the queue", "等待模型：排在队列第 {place} 位"),
    # a request its user stopped before its turn came (serve/outcome.py, Outcome.withdrawn)
    "stopped_waiting": ("stopped while it waited for its turn: nothing was generated", "在排队等待时停止：没有生成任何内容"),
    # the model panel (serve/model_host.py)
    "not_a_model": ("{name} is not one of the models this app was started with ({names})",
                    "{name} 不是本应用启动时给定的模型之一（{names}）"),
    "load_failed": ("could not load {name}: {reason}", "无法加载 {name}：{reason}"),
    "no_model_named": ("type a hub id or the path of a local checkpoint directory to load",
                       "请输入要加载的模型：模型库中的名称，或本地检查点目录的路径"),
    # {flag}: app.py's --allow-load
    "load_not_allowed": ("loading and unloading models is off on this server (start the app with {flag} to allow it)",
                         "此服务器未开启模型的加载和卸载（启动应用时加上 {flag} 即可开启）"),
    "last_model": ("{name} is the only model left: load another before unloading it",
                   "{name} 是仅剩的模型：请先加载另一个，再卸载它"),
    "not_enough_memory": ("not enough memory to load {name}: its weights need {needed:.1f} GB, and {available:.1f} GB "
                          "is free", "内存不足，无法加载 {name}：其权重需要 {needed:.1f} GB，而可用内存只有 {available:.1f} GB"),
    # a load's steps (serve.model_host.LOAD_STEPS), shown by the page's progress bar
    "load_step_download": ("fetching {name}", "正在获取 {name}"),
    "load_step_load": ("reading the weights of {name}", "正在读取 {name} 的权重"),
    "load_step_kernels": ("preparing {name} for decoding", "正在为解码准备 {name}"),
    # what a prompt had to drop (tasks/), shown in the status line
    "dropped_turn": ("dropped the {count} oldest turn to fit the context", "为放入上下文，删去了最早的 {count} 轮"),
    "dropped_turns": ("dropped the {count} oldest turns to fit the context", "为放入上下文，删去了最早的 {count} 轮"),
    "dropped_examples": ("dropped {count:,} of the {total:,} examples to fit the context",
                         "为放入上下文，删去了 {total:,} 个示例中的 {count:,} 个"),
    "no_examples": ("no example pairs sent: only the first line names the languages, and the model may still answer "
                    "in the wrong language", "未发送示例对：只有第一行写明了语言，模型仍可能用错误的语言回答"),
    "first_sentence_only": ("only the first sentence is translated: the model learnt one at a time, so give it the "
                            "others one by one", "只翻译第一句：模型是逐句学会翻译的，其余句子请逐句输入"),
    "prompt_cut": ("prompt cut to its last {room:,} of {tokens:,} tokens to fit the context",
                   "为放入上下文，提示词只保留了最后 {room:,} 个词元（共 {tokens:,} 个）"),
    "article_cut": ("article cut to its first {room:,} of {tokens:,} tokens to fit the context",
                    "为放入上下文，文章只保留了前 {room:,} 个词元（共 {tokens:,} 个）"),
    "output_room": ("max_new_tokens keeps {reserved:,} of the context's {context:,} tokens for the output; set it "
                    "below {reserved:,} to let the model read more",
                    "最多生成的词元数为输出预留了上下文 {context:,} 个词元中的 {reserved:,} 个；设为小于 {reserved:,} "
                    "可让模型读入更多"),
    "translated_through": ("translated through {language} (first step: {prompt} prompt + {generated} generated "
                           "tokens): {text}", "经由{language}翻译（第一步：提示词 {prompt} + 生成 {generated} 个词元）：{text}"),
    "first_step_cut": ("the first step's output cut to its first {kept:,} of {tokens:,} tokens to fit the second "
                       "step's context", "为放入第二步的上下文，第一步的输出只保留了前 {kept:,} 个词元（共 {tokens:,} 个）"),
    "notebook_tail": ("sent the prompt's last {kept:,} of {characters:,} characters, the most a run takes",
                      "只发送了提示词的最后 {kept:,} 个字符（共 {characters:,} 个），这是一次运行能接受的上限"),
    # a comparison's note that only the side not shown made, after that side's label (serve/comparing.py)
    "side_note": ("{side}: {note}", "{side}：{note}"),
    # the Chat tab's line on its next prompt (serve/model_host.py, conversation_room)
    "context_used": ("{tokens:,} of {context:,} tokens of context ({share:.0%})",
                     "上下文 {context:,} 个词元中已用 {tokens:,} 个（{share:.0%}）"),
    "will_drop_turn": ("the next prompt will leave out the {count} oldest turn to fit the context",
                       "为放入上下文，下一次的提示词将删去最早的 {count} 轮"),
    "will_drop_turns": ("the next prompt will leave out the {count} oldest turns to fit the context",
                        "为放入上下文，下一次的提示词将删去最早的 {count} 轮"),
    "article_length": ("{tokens:,} of {context:,} context tokens in the prompt; the summary may use up to {left:,}",
                       "提示词占上下文 {context:,} 个词元中的 {tokens:,} 个；摘要最多可用 {left:,} 个"),
    # the token view (ui/tokens.py)
    "alternatives_to": ("alternatives to token {index} ({token})", "第 {index} 个词元（{token}）的备选"),
    "tokens_note": ("green: a likely token, through yellow, to red: an unlikely one; point at a token for its "
                    "probability and alternatives; click (or tap) it to list them and continue from one",
                    "绿色：可能性高的词元，经黄色，到红色：可能性低的；指向一个词元可看其概率和备选；"
                    "点击（或轻触）它可列出备选，并从其中一个继续"),
    "differ_from": ("the two differ from token {index}", "两者从第 {index} 个词元起不同"),
    "differ_from_character": ("the texts differ from character {character}: token {first} of the first, token {second} "
                              "of the second (the two models split text into different tokens)",
                              "两段文字从第 {character} 个字符起不同：第一段的第 {first} 个词元，第二段的第 {second} 个"
                              "（两个模型的分词不同）"),
    "same_text_differ_from": ("the texts are the same, but their tokens differ from token {index}",
                              "两段文字相同，但词元从第 {index} 个起不同"),
    "no_tokens": ("tick Show tokens before a run to see its tokens here", "运行前勾选「显示词元」，即可在此看到其词元"),
    "no_tokens_kept": ("this output has no tokens to show", "此输出没有可显示的词元"),
    "same": ("the two are the same", "两者相同"),
    "continued_from": ("continued from token {index} with {token}", "从第 {index} 个词元续写，换为 {token}"),
    "pick_alternative": ("click a token, then one of its alternatives", "请先点击一个词元，再选择它的一个备选"),
    # a page in front of a deployment's replicas (serve/backend.py)
    "backend_down": ("the backend {url} does not answer ({kind}); please try again",
                     "后端 {url} 没有响应（{kind}）；请重试"),
    "backend_failed": ("the backend {url} failed (HTTP {status}); please try again",
                       "后端 {url} 出错（HTTP {status}）；请重试"),
    "backend_cut": ("the backend {url} stopped answering in the middle of this run; please try again",
                    "后端 {url} 在这次运行中途停止了响应；请重试"),
    "backend_stopped": ("stopped: the token counts stay with the backend", "已停止：词元计数留在后端"),
    "backend_only": ("'{name}' is not served by the backend {url}", "后端 {url} 不提供「{name}」"),
    "backend_loads": ("models are loaded and unloaded on the backend {url}, not from this page",
                      "模型在后端 {url} 上加载和卸载，不能从此页面操作"),
    # a deployment's ingress, where the replica serving a request stops (serve/cluster.py)
    "replica_lost": ("the replica serving this request stopped in the middle of its answer; please retry",
                     "处理这个请求的副本在回答中途停止了；请重试"),
    "replicas_lost": ("the replicas tried for this request ({tries}) stopped before answering; please retry",
                      "为这个请求尝试过的副本（{tries} 个）都在回答前停止了；请重试"),
    "replica_failed": ("the replica serving this request failed ({kind}); please retry",
                       "处理这个请求的副本出错（{kind}）；请重试"),
    # which path decodes (engine/kernels.py, decode_state; serve/model_host.py)
    "kernels_on": ("decode kernels ({capability})", "解码内核（{capability}）"),
    "kernels_on_int8": ("decode kernels ({capability}; int8 products on {int8_dot})",
                        "解码内核（{capability}；8 位整数乘积用 {int8_dot}）"),
    "kernels_off": ("PyTorch ({reason})", "PyTorch（{reason}）"),
    "no_avx2": ("the CPU has no AVX2 ({capability})", "CPU 不支持 AVX2（{capability}）"),
    "build_failed": ("the build failed ({kind})", "构建失败（{kind}）"),
    # the status line of a run (serve/outcome.py, status_line)
    "status": ("seed {seed} · {prompt} prompt + {generated} generated tokens · {speed} tokens/s · stopped: {reason}",
               "种子 {seed} · 提示词 {prompt} + 生成 {generated} 个词元 · 每秒 {speed} 个词元 · 停止原因：{reason}"),
    "adapter_off": ("adapter off", "适配器关"),
    "adapter_on": ("adapter on", "适配器开"),
    "adapter_on_scaled": ("adapter on at strength {scale:g}", "适配器开，强度 {scale:g}"),
    # a comparison (serve/comparing.py): both sides' labels, and the one the output box shows
    "compared_sides": ("{a} vs {b}: the output and counts are with {shown}", "{a}与{b}对比：输出和计数属于{shown}一侧"),
    "compared_side": ("the {side} side of a comparison", "对比中{side}的一侧"),
    "steering_off": ("unsteered", "未转向"),
    "steering_on": ("steered", "已转向"),
    "model_side": ("model {model}", "模型 {model}"),
    "setting_side": ("{setting} {value:g}", "{setting} {value:g}"),
    "changed_settings": ("changed settings: {settings}", "更改的设置：{settings}"),  # settings: ((name, value), ...)
    # a run's steering (serve/running.py, steering_state); its texts are fields too, not said
    "steered": ("steered at layer {layer}, strength {strength:g}: {pairs} pairs, vector norm {norm:.1f} against a "
                "residual norm of {typical:.1f}",
                "在第 {layer} 层转向，强度 {strength:g}：{pairs} 对文本，向量范数 {norm:.1f}，该层残差范数约 {typical:.1f}"),
    # ... by a vector file's vector (serve/vectors.py): its name and the start of its sha256 ({digest})
    "steered_file": ("steered at layer {layer}, strength {strength:g} by {file} (sha256 {digest}): vector norm "
                     "{norm:.1f} against a residual norm of {typical:.1f}",
                     "在第 {layer} 层转向，强度 {strength:g}，向量来自 {file}（sha256 {digest}）：向量范数 {norm:.1f}，"
                     "该层残差范数约 {typical:.1f}"),
    # ... as a page in front of replicas knows it, where the run was stopped before the replica said (serve/backend.py)
    "steered_asked": ("steered at layer {layer}, strength {strength:g}: {pairs} pairs",
                      "在第 {layer} 层转向，强度 {strength:g}：{pairs} 对文本"),
    "steered_file_asked": ("steered at layer {layer}, strength {strength:g} by {file} (sha256 {digest})",
                           "在第 {layer} 层转向，强度 {strength:g}，向量来自 {file}（sha256 {digest}）"),
    # steering vectors as files (serve/vectors.py, ui/steer.py)
    "steer_imported": ("steering by {file} (sha256 {digest}), made at layer {layer} on {model}; the strength is the "
                       "slider's, and lines typed above steer by them instead",
                       "按 {file}（sha256 {digest}）转向，该向量在 {model} 的第 {layer} 层生成；强度取滑块的值；"
                       "在上面输入文本行则改按这些文本转向"),
    "steer_no_gguf": ("no llama.cpp control vector (GGUF) for layer {layer}: llama.cpp steers after blocks {first} to "
                      "{n_layer} only; the safetensors file keeps it",
                      "第 {layer} 层没有 llama.cpp 控制向量（GGUF）：llama.cpp 只在第 {first} 到第 {n_layer} 个块之后转向；"
                      "safetensors 文件中有它"),
    "steer_nothing": ("there is no steering to export: write positive and negative lines, or import a vector, and "
                      "set a strength", "没有可导出的转向：请填写正例和反例各行，或导入向量，并设置强度"),
    "steer_not_a_vector": ("{file} is not a steering vector: the app reads llama.cpp control vectors (GGUF) and the "
                           "safetensors files it exports",
                           "{file} 不是转向向量：本应用读取 llama.cpp 控制向量（GGUF）和它自己导出的 safetensors 文件"),
    "steer_vector_width": ("{file} holds a vector of {width:,} numbers; this model's residual stream has {n_embd:,}",
                           "{file} 中的向量有 {width:,} 个数；此模型的残差流是 {n_embd:,} 维"),
    "steer_vector_layers": ("{file} was made for a model of {layers:,} blocks; this one has {n_layer:,}",
                            "{file} 是为有 {layers:,} 个块的模型生成的；此模型有 {n_layer:,} 个块"),
    "steer_vector_layer": ("{file} steers after block {layer:,}; this model has {n_layer:,} blocks",
                           "{file} 在第 {layer:,} 个块之后转向；此模型只有 {n_layer:,} 个块"),
    "steer_file_layers": ("{file} steers at {count} layers; the app steers after one: give it a file of one layer",
                          "{file} 在 {count} 层上转向；本应用只在一层之后转向：请给它只含一层的文件"),
    "steer_file_size": ("{file} is {size:,} bytes; a steering vector file is at most {limit:,}",
                        "{file} 有 {size:,} 字节；转向向量文件最多 {limit:,} 字节"),
    "steer_file_record": ("{name} must hold a vector file's name, its sha256 and a list of {width:,} finite numbers",
                          "{name}必须包含向量文件的名称、其 sha256 和由 {width:,} 个有限数组成的列表"),
    # the Steer section's line once a run has computed the vector (ui/steer.py)
    "steer_norm": ("layer {layer}: vector norm {norm:.1f} against a residual norm of {typical:.1f} there, so strength "
                   "{strength:g} adds {share:.0%} of it", "第 {layer} 层：向量范数 {norm:.1f}，该层残差范数约 {typical:.1f}；"
                   "强度 {strength:g} 加上它的 {share:.0%}"),
    # steering texts that do not pair up (serve/running.py, steering_asked)
    "steer_pairs": ("steer_positive and steer_negative are pairs of lines, the i-th positive with the i-th negative: "
                    "got {positive} positive and {negative} negative",
                    "转向按行成对：第 i 行正例与第 i 行反例为一对；收到正例 {positive} 行、反例 {negative} 行"),
    # a task tab's decoding presets (ui/presets.py); {preset}: its name, said as it is
    "preset_default": ("Default (built-in)", "默认（内置）"),
    "preset_greedy": ("Greedy (built-in)", "贪心（内置）"),
    "preset_saved": ("saved the preset {preset}", "已保存预设「{preset}」"),
    "preset_applied": ("applied the preset {preset}", "已应用预设「{preset}」"),
    "preset_deleted": ("deleted the preset {preset}", "已删除预设「{preset}」"),
    "preset_left_out": ("applied the preset {preset} without what this version of the app has no setting for: "
                        "{names}", "已应用预设「{preset}」，但略去了本版本应用没有的设置：{names}"),
    "preset_refused": ("the preset {preset} was not applied: {error}", "未应用预设「{preset}」：{error}"),
    "preset_unreadable": ("the preset {preset} could not be read: it was not saved by this version of the app",
                          "无法读取预设「{preset}」：它不是由本版本的应用保存的"),
    "preset_built_in": ("{preset} is a built-in preset: it cannot be saved over or deleted",
                        "「{preset}」是内置预设：不能覆盖或删除"),
    "no_preset_picked": ("pick a preset to delete first", "请先选择要删除的预设"),
    # an error no key was given for (a library's, say): its own text, in every language
    "text": ("{text}", "{text}"),
}

# The interface's Chinese labels of what a message may name: ui/i18n.py takes them from here, so that
# a message names a setting or a box as the page labels it.
LABELS_ZH = {
    "temperature": "温度", "top_k": "Top-k", "top_p": "Top-p", "min_p": "Min-p", "typical_p": "典型采样 p",
    "repetition_penalty": "重复惩罚", "presence_penalty": "存在惩罚", "frequency_penalty": "频率惩罚",
    "stop": "停止串",
    "no_repeat_ngram_size": "禁止重复的 n-gram 长度", "max_new_tokens": "最多生成的词元数", "seed": "随机种子",
    "prompt": "提示词", "message": "消息", "persona": "角色设定", "article": "文章", "conversation": "对话",
    "English": "英语", "French": "法语", "German": "德语", "source_text": "待翻译文本",
    "source_language": "源语言", "target_language": "目标语言", "example_pairs": "示例句对",
}
# What a message may name, as the code names it, and its Chinese: API parameters and settings (by
# their interface label), the phrases `too_long` is given, units, and why a run stopped.
NAMES_ZH: dict[str, str] = {
    **{name: LABELS_ZH[name] for name in ("temperature", "top_k", "top_p", "min_p", "typical_p", "repetition_penalty",
                                          "presence_penalty", "frequency_penalty", "no_repeat_ngram_size",
                                          "max_new_tokens", "seed", "stop", "prompt", "message", "persona", "article",
                                          "English", "French", "German")},
    "text": LABELS_ZH["source_text"], "text to translate": LABELS_ZH["source_text"],
    "source": LABELS_ZH["source_language"], "target": LABELS_ZH["target_language"],
    "examples": LABELS_ZH["example_pairs"], "history": LABELS_ZH["conversation"],
    "the persona and the message": "角色设定和消息", "the text to translate": "要翻译的文本",
    "TL;DR: and one token of the article": "TL;DR: 和文章的一个词元",
    "example pairs": LABELS_ZH["example_pairs"], "turns in history": "对话历史的轮数",
    # why a run stopped (serve.outcome.STOP_REASON_WORDS)
    "end of text": "文本结束", "stop string": "停止串", "max_new_tokens reached": "达到最大词元数",
    "context full": "上下文已满", "Stop pressed": "已按停止", "answer complete": "回答完整",
    "none": "无", "(nothing)": "（无）", "layer": "层", "head": "注意力头",
    "decode kernels building": "解码内核构建中", "kernels switched off": "内核已关闭", "no kernels": "无内核",
    "no C++ compiler": "没有 C++ 编译器",
    "STUDIO_DECODE_KERNELS=0": "已由 STUDIO_DECODE_KERNELS=0 关闭",
    "not JSON": "不是 JSON", "not a JSON object": "不是 JSON 对象", "no history": "没有对话历史",  # an import that is no conversation
    "adapter on": "适配器开", "adapter off": "适配器关", "unsteered": "未转向", "steered": "已转向", "output": "输出",
    "steer_positive": "转向正例", "steer_negative": "转向反例", "steer_layer": "转向层", "steer_strength": "转向强度",
    "steering pairs": "转向文本对", "compare": "对比项", "values": "参数", "task": "任务",
    "steer_file": "转向向量文件", "unknown": "未知模型",
    "clean prompt": "干净提示词", "corrupted prompt": "损坏提示词", "noise span": "噪声片段", "answer": "答案",
    "preset name": "预设名称", "presets": "预设",
}

# The model line at the top of the page (serve/model_host.py, LoadedModel.describe), by language.
MODEL_LINE = {
    "en": "**{name}** · {millions}M parameters · context {context} tokens · tokenizer {tokenizer} ({vocab} tokens) "
          "· adapters: {adapters} · {device}",
    "zh": "**{name}** · {millions}M 参数 · 上下文 {context} 个词元 · 分词器 {tokenizer}（{vocab} 个词元）"
          "· 适配器：{adapters} · {device}",
}
# The Architecture tab's top-10 table's headers, which the browser cannot translate, by language.
TOP_HEADERS = {"en": ["token", "probability"], "zh": ["词元", "概率"]}
# The Architecture tab's live plots' own text (titles, axes, legends): drawn into the image on
# the server, where the browser cannot translate it.
PLOT_TEXT = {
    "en": {"norm_title": "Residual stream norm, {model}", "range": "range over tokens", "mean": "mean over tokens",
           "last": "last token", "after_layer": "after layer",
           "attention_title": "Attention, layer {layer}, head {head}", "key": "key (attended to)", "query": "query",
           "lens_title": "Logit lens: each layer's top next token", "lens_adapter": "adapter {adapter} (red: changed)",
           "layer": "layer", "after_token": "after the token", "probability": "probability",
           "trace_grid": "Residual stream", "trace_attention": "Attention output", "trace_mlp": "MLP output",
           "trace_effect": "restored: effect on p({answer})", "effect": "normalised effect",
           "token": "token", "token_noised": "token (* noised)", "trace_unit": "layers"},
    "zh": {"norm_title": "残差流范数，{model}", "range": "各词元的范围", "mean": "各词元的平均",
           "last": "最后一个词元", "after_layer": "经过的层",
           "attention_title": "注意力，第 {layer} 层，第 {head} 个头", "key": "键（被关注的词元）", "query": "查询",
           "lens_title": "logit 透镜：每一层预测的下一个词元", "lens_adapter": "适配器 {adapter}（红框：有改变）",
           "layer": "层", "after_token": "在这个词元之后", "probability": "概率",
           "trace_grid": "残差流", "trace_attention": "注意力输出", "trace_mlp": "MLP 输出",
           "trace_effect": "恢复后对 p({answer}) 的效果", "effect": "归一化效果",
           "token": "词元", "token_noised": "词元（* 加了噪声）", "trace_unit": "层"},
}
# The line above a trace's heatmaps: the answer traced and its probabilities, clean and corrupted.
TRACE_LINE = {"en": "answer {answer} · p_clean {p_clean:.3g} · p_corrupted {p_corrupted:.3g}",
              "zh": "答案 {answer} · 干净运行的概率 p_clean {p_clean:.3g} · 损坏运行的概率 p_corrupted {p_corrupted:.3g}"}
MODEL_LINE_QUANTIZED = {"en": " · {quantize} weights", "zh": " · {quantize} 权重"}
MODEL_LINE_DECODING = {"en": " · decoding on {path}", "zh": " · 解码方式：{path}"}

# Fields whose text is the user's, the model's or a token's, said as it is in every language.
AS_GIVEN = {"token", "span", "answer", "preset", "file"}


def render(message: Message, lang: str) -> str:
    """`message` in `lang` ("zh" Chinese, anything else English)."""
    in_english, in_chinese = TEMPLATES[message.key]
    template = in_chinese if lang == "zh" else in_english
    return template.format(**{name: shown(name, value, lang) for name, value in message.fields})


def english(message: Message) -> str:
    """As the APIs and the log say it."""
    return render(message, "en")


def shown(name: str, value: Any, lang: str) -> Any:
    """A field as its template takes it: a message rendered, names said in `lang`, a number as it is
    (its template formats it)."""
    if isinstance(value, Message):
        return render(value, lang)
    if isinstance(value, tuple):  # settings with their values: ((name, value), ...)
        return ("，" if lang == "zh" else ", ").join(f"{said(setting, lang)} {setting_value(setting_is)}"
                                                     for setting, setting_is in value)
    if not isinstance(value, str) or lang != "zh" or name in AS_GIVEN:
        return value
    items = value.split(", ")
    translated = [NAMES_ZH.get(item, item) for item in items]
    if len(items) > 1 and any(new == old for new, old in zip(translated, items)):
        return value  # not a list of names the app uses (model names, say): as it is
    return "，".join(translated)


def setting_value(value: Any) -> str:
    """A setting's value as a status line says it: a number as short as it goes; stop strings as a
    JSON list, their line ends and quotes escaped, as the API takes them back."""
    if isinstance(value, tuple):
        return json.dumps(list(value), ensure_ascii=False)
    return f"{value:g}"


def said(name: str, lang: str) -> str:
    """A name the app uses (a setting, a box, a language, a word of the page), in `lang`."""
    return NAMES_ZH.get(name, name) if lang == "zh" else name


def message_of(error: BaseException) -> Message:
    """What an error says to the user: a refusal's own message; a prompt the engine cannot take,
    with its counts; anything else in its own words."""
    if isinstance(error, Refusal):
        return error.message
    if isinstance(error, ContextLengthError):
        return Message.keyed("prompt_fills_context", tokens=error.tokens, context=error.context)
    return Message.keyed("text", text=str(error))


def localized(what: Message | BaseException, lang: str) -> str:
    """A message, or what an error says, in `lang`."""
    return render(what if isinstance(what, Message) else message_of(what), lang)
